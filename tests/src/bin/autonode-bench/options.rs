//! The command line: how many of each measurement, and where the
//! agent binary and the results are.

use anyhow::{bail, ensure, Context, Result};
use autonode_tests::machines::node;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) const USAGE: &str =
    "usage: autonode-bench [--joins N] [--bare N] [--burst N] [--hostile-burst N] \
[--burst-large N] [--stock N] [--fleet N,N..] [--attested N] [--renewal-wave N] [--renewal-wave-stock N] [--warmup N] [--ignition-kib N] [--kcm-qps N] [--agent PATH] [--identity FILE] [--out FILE]

  --joins N        agent joins one at a time (100; 0 with --bare 0: none)
  --bare N         bare kubelet CSRs and join's writes alone, interleaved (100)
  --burst N        joins at once, after their API writes alone at once
                   (1000; 0: none)
  --hostile-burst N  joins at once beside hostile clients (1000; 0: none)
  --burst-large N  joins at once on a fresh control plane, to see the burst
                   scale (5000; 0: none)
  --stock N        kubelet TLS bootstraps at once the stock way (client CSR
                   approved by kube-controller-manager, serving CSR by a
                   one-worker approver) (1000; 0: none)
  --attested N     attested joins (challenge, NitroTPM document, /v2)
                   interleaved with plain ones on one server (0: none)
  --renewal-wave N N joined nodes' client renewals and serving CSRs at once,
                   approved by the server (0: none)
  --renewal-wave-stock N  the same for N nodes the stock way (kcm's client
                   approver at its default limits, a one-worker serving
                   approver), after the wave (1000, at most N; 0: none)
  --kcm-qps N      kube-controller-manager's client limit, requests a second
                   (burst twice that), where the control plane raises it
                   from the default: its CSR signer signs at most N
                   certificates a second, for either path (100)";

/// Agent runs and bare CSRs not counted, to warm connections and caches.
pub(crate) const WARMUP: usize = 3;
/// Launch calls (NodeClaim create + providerID) in flight at once.
pub(crate) const LAUNCH_CONCURRENCY: usize = 16;
/// A burst join that has not succeeded by then has failed (for a burst of
/// up to 1,000; a larger one allows as much more as it is larger).
pub(crate) const BURST_DEADLINE: Duration = Duration::from_secs(300);

pub(crate) struct Options {
    pub(crate) joins: usize,
    pub(crate) bare: usize,
    pub(crate) burst: usize,
    pub(crate) hostile_burst: usize,
    pub(crate) burst_large: usize,
    pub(crate) stock: usize,
    /// Fleet sizes to measure the server among (`--fleet`).
    pub(crate) fleet: Vec<usize>,
    pub(crate) renewal_wave: usize,
    /// Attested joins beside as many plain ones (`--attested`).
    pub(crate) attested: usize,
    pub(crate) renewal_wave_stock: usize,
    pub(crate) warmup: usize,
    /// For the joins one at a time: a base Ignition layer of this many KiB
    /// (`--base-ignition`), or none (0).
    pub(crate) ignition_kib: usize,
    /// kube-controller-manager's client limit (`--kcm-qps`).
    pub(crate) kcm_qps: u32,
    pub(crate) agent: PathBuf,
    pub(crate) identity: Option<PathBuf>,
    pub(crate) out: PathBuf,
}

impl Options {
    pub(crate) fn parse() -> Result<Self> {
        let mut options = Options {
            joins: 100,
            bare: 100,
            burst: 1000,
            hostile_burst: 1000,
            burst_large: 5000,
            stock: 1000,
            fleet: Vec::new(),
            renewal_wave: 0,
            attested: 0,
            renewal_wave_stock: 1000,
            warmup: WARMUP,
            ignition_kib: 0,
            kcm_qps: 100,
            agent: node::agent_binary()?,
            identity: None,
            out: PathBuf::from("target/bench/results.json"),
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--joins" => options.joins = value()?.parse()?,
                "--bare" => options.bare = value()?.parse()?,
                "--burst" => options.burst = value()?.parse()?,
                "--hostile-burst" => options.hostile_burst = value()?.parse()?,
                "--burst-large" => options.burst_large = value()?.parse()?,
                "--stock" => options.stock = value()?.parse()?,
                "--fleet" => {
                    options.fleet = value()?
                        .split(',')
                        .map(|n| n.trim().parse())
                        .collect::<Result<_, _>>()?
                }
                "--renewal-wave" => options.renewal_wave = value()?.parse()?,
                "--attested" => options.attested = value()?.parse()?,
                "--renewal-wave-stock" => options.renewal_wave_stock = value()?.parse()?,
                "--warmup" => options.warmup = value()?.parse()?,
                "--ignition-kib" => options.ignition_kib = value()?.parse()?,
                "--kcm-qps" => options.kcm_qps = value()?.parse()?,
                "--agent" => options.agent = value()?.into(),
                "--identity" => options.identity = Some(value()?.into()),
                "--out" => options.out = value()?.into(),
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other}\n{USAGE}"),
            }
        }
        ensure!((options.joins > 0) == (options.bare > 0), "{USAGE}");
        Ok(options)
    }
}
