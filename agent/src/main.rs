//! autonode-agent: run by systemd at boot, before kubelet.
//!
//! config → identity → keys → join → apply → start, one way. Each phase
//! logs `phase=<name> started` and `phase=<name> succeeded`, is recorded in
//! the state directory, and is reported to the server; a failure is logged,
//! written to the console, reported, and ends the agent with an exit code
//! that says what kind of failure it was.

#![forbid(unsafe_code)]

mod ignition_cmd;

use anyhow::Context as _;
use autonode_agent::config::{self, Config, Document, UserDataDocument};
use autonode_agent::fsutil::{Durability, Root};
use autonode_agent::ignition::{self, units};
use autonode_agent::imds::{self, Identity, Imds};
use autonode_agent::join::{JoinError, ServerClient};
use autonode_agent::kubelet::{self, KubeletError};
use autonode_agent::proxy::Route;
use autonode_agent::report::{Reporter, RetryNotices, REPORT_BUDGET};
use autonode_agent::retry::Deadline;
use autonode_agent::retry::Retrying;
use autonode_agent::state::{self, StateDir};
use autonode_agent::{csr, keys, logging};
use autonode_shared::protocol::{JoinRequest, JoinResponse, Outcome, Phase};
use clap::Parser;
use rcgen::KeyPair;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tokio::task::JoinSet;

const EXIT_CODES: &str = "\
Exit codes:
  0  joined (or already joined: a second run verifies and exits)
  1  failed on this node (a file could not be written, systemctl failed, ...)
  2  refused: the server refused the join, or sent something the agent refuses
  3  gave up: no answer from IMDS or the server by the deadline
  4  bad local config: userData, the local config file or flags

Every absolute path the agent writes (and --config-file, --state-dir) is
resolved under --root.

Proxy: the connection to the server (the join and the progress reports)
goes through the HTTP proxy in `[options] https-proxy`, else $HTTPS_PROXY,
else $https_proxy (HTTP CONNECT; TLS to the server end to end), except for
hosts in `[options] no-proxy`, else $NO_PROXY, else $no_proxy. The config
wins over the environment. IMDS is never reached through a proxy.";

/// Makes this EC2 instance a Kubernetes node: reads its identity from IMDSv2,
/// proves it to autonode-server, and starts kubelet with the credentials and
/// configuration it receives.
#[derive(Debug, Parser)]
#[command(name = "autonode-agent", version, about, after_help = EXIT_CODES)]
struct Cli {
    /// Local config file overriding userData (TOML, same keys); may be absent.
    #[arg(long, value_name = "PATH", default_value = config::LOCAL_FILE)]
    config_file: String,
    /// Do not read the config from userData (the local file and flags must
    /// then hold all of it).
    #[arg(long)]
    no_user_data: bool,
    /// Overrides `server-url`.
    #[arg(long, value_name = "URL")]
    server_url: Option<String>,
    /// Overrides `server-ca` with the PEM in this file.
    #[arg(long, value_name = "PATH")]
    server_ca_file: Option<PathBuf>,
    /// Overrides `server-ca-sha256`.
    #[arg(long, value_name = "HEX")]
    server_ca_sha256: Option<String>,
    /// Overrides `cluster-name`.
    #[arg(long, value_name = "NAME")]
    cluster_name: Option<String>,
    /// Overrides `options.deadline` ("90s", "10m"; at most 15m).
    #[arg(long, value_name = "DURATION")]
    deadline: Option<String>,
    /// Overrides `options.state-dir`.
    #[arg(long, value_name = "PATH")]
    state_dir: Option<PathBuf>,
    /// Directory every path is written under (tests use a temp dir).
    #[arg(long, value_name = "PATH", default_value = "/")]
    root: PathBuf,
    /// IMDS base URL (plain http), e.g. a stand-in on loopback.
    ///
    /// The endpoint is, first match wins: this flag;
    /// $AWS_EC2_METADATA_SERVICE_ENDPOINT; the endpoint of the mode from
    /// --imds-endpoint-mode, then `[options] imds-endpoint-mode` in the local
    /// config file, then $AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE; else IPv4,
    /// http://169.254.169.254. An explicit endpoint beats any mode, as in the
    /// AWS SDKs.
    #[arg(long, value_name = "URL")]
    imds_endpoint: Option<String>,
    /// IMDS endpoint mode: IPv4 (http://169.254.169.254) or IPv6
    /// (http://[fd00:ec2::254]); any case. See --imds-endpoint for precedence.
    #[arg(long, value_name = "MODE")]
    imds_endpoint_mode: Option<String>,
    /// systemctl to run (`daemon-reload` when units changed, then
    /// `start --no-block <units> kubelet.service`).
    #[arg(
        long,
        alias = "start-command",
        value_name = "PATH",
        default_value = "systemctl"
    )]
    systemctl: String,
    /// kubelet binary the kubelet.service drop-in runs.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/kubelet")]
    kubelet_path: String,
    /// Leave starting kubelet.service to systemd, as the package's unit
    /// does (its `Wants=kubelet.service` queues kubelet behind the agent);
    /// only the units Ignition enabled are started.
    #[arg(long)]
    no_start_kubelet: bool,
    /// Where failures are echoed for the EC2 console output.
    #[arg(long, value_name = "PATH", default_value = "/dev/console")]
    console: PathBuf,
    /// Log debug messages too.
    #[arg(long, short)]
    verbose: bool,
    /// A tool instead of a join (`ignition apply`).
    #[command(subcommand)]
    tool: Option<Tool>,
}

/// Tools run by hand or by tests instead of a join.
#[derive(Debug, clap::Subcommand)]
enum Tool {
    /// Ignition tools.
    #[command(subcommand)]
    Ignition(ignition_cmd::IgnitionCommand),
}

/// What kind of failure ended the run; the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Failed = 1,
    Refused = 2,
    Deadline = 3,
    Config = 4,
}

#[derive(Debug)]
struct Failure {
    kind: Kind,
    phase: Phase,
    error: anyhow::Error,
}

fn fail(kind: Kind, phase: Phase) -> impl FnOnce(anyhow::Error) -> Failure {
    move |error| Failure { kind, phase, error }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.verbose);
    if let Some(Tool::Ignition(command)) = &cli.tool {
        return ignition_cmd::run(command);
    }
    // The first line, as early as logging allows, with how long ago the
    // process was forked: the VM test splits the agent's start-up with it
    // (systemd's sandbox and the exec before main, the journal after).
    let age = process_age().map_or("unknown".into(), |s| format!("{s:.2}"));
    log::info!(
        "autonode-agent {} starting since_fork_s={age}",
        env!("CARGO_PKG_VERSION")
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(run(&cli)),
        Err(e) => Err(Failure {
            kind: Kind::Failed,
            phase: Phase::Config,
            error: e.into(),
        }),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            let message = format!(
                "phase={} failed: {:#}",
                failure.phase.as_str(),
                failure.error
            );
            log::error!("{message}");
            logging::to_console(&cli.console, &message);
            ExitCode::from(failure.kind as u8)
        }
    }
}

/// Seconds since this process was forked, from /proc (both times count
/// from boot, in kernel ticks of 10 ms); `None` without /proc.
fn process_age() -> Option<f64> {
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let uptime: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: count fields after its ')'.
    // starttime is field 22, the 20th after the name.
    let ticks: f64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    Some((uptime - ticks / 100.0).max(0.0))
}

/// Everything a run has learnt so far.
struct Run<'a> {
    cli: &'a Cli,
    root: Root,
    config: Config,
    deadline: Deadline,
    state: StateDir,
    /// The last phase an earlier run recorded.
    resumed: Option<Phase>,
    /// Reports sent in the background, waited for before exit.
    reports: JoinSet<()>,
}

async fn run(cli: &Cli) -> Result<(), Failure> {
    let root = Root::new(&cli.root);
    let started = tokio::time::Instant::now();
    let config = load_config(cli, &root).await?;
    let deadline = Deadline::after(config.deadline.saturating_sub(started.elapsed()));
    let state_dir = root
        .join(&config.state_dir.to_string_lossy())
        .context("state-dir")
        .map_err(fail(Kind::Config, Phase::Config))?;
    let mut run = Run {
        cli,
        root,
        config,
        deadline,
        state: StateDir::new(state_dir),
        resumed: None,
        reports: JoinSet::new(),
    };
    if already_joined(&mut run)? {
        return Ok(());
    }
    let identity = phase_identity(&run).await?;
    let client = ServerClient::new(&run.config)
        .context("server trust")
        .map_err(fail(Kind::Config, Phase::Config))?;
    let route = run
        .config
        .proxy
        .route(run.config.server_url.host().unwrap_or_default());
    match route {
        Route::Direct => log::debug!("server connection: {route}"),
        _ => log::info!("server connection: {route}"),
    }
    let reporter = Reporter::new(client.clone(), identity.rsa2048.clone());
    let mut key = None;
    let result = join_and_start(&mut run, &identity, &client, &reporter, &mut key).await;
    if let Err(failure) = &result {
        let message = format!("{:#}", failure.error);
        reporter
            .send(failure.phase, Outcome::Fatal, &message, key.as_ref())
            .await;
    }
    // Progress reports had their own budget; don't wait longer than that.
    let _ = tokio::time::timeout(REPORT_BUDGET, async {
        while run.reports.join_next().await.is_some() {}
    })
    .await;
    result
}

fn started(phase: Phase) {
    log::info!("phase={} started", phase.as_str());
}

fn succeeded(phase: Phase, detail: &str) {
    log::info!("phase={} succeeded {detail}", phase.as_str());
}

/// userData < local file < flags.
async fn load_config(cli: &Cli, root: &Root) -> Result<Config, Failure> {
    started(Phase::Config);
    let bad = fail(Kind::Config, Phase::Config);
    let local = read_local_file(root, &cli.config_file).map_err(bad)?;
    let flags = flag_document(cli).map_err(fail(Kind::Config, Phase::Config))?;
    let upper = local.overlay(flags);
    let user_data = if cli.no_user_data {
        UserDataDocument::Config(Document::default())
    } else {
        let early = upper
            .options
            .deadline
            .as_deref()
            .map(config::parse_deadline)
            .transpose();
        let early = early
            .context("deadline")
            .map_err(fail(Kind::Config, Phase::Config))?;
        let mode = upper.options.imds_endpoint_mode.as_deref();
        let mode = mode.map(|m| imds::EndpointMode::parse(m, imds::MODE_KEY));
        let mode = mode
            .transpose()
            .map_err(|e| fail(Kind::Config, Phase::Config)(e.into()))?;
        let deadline = Deadline::after(early.unwrap_or(config::DEFAULT_DEADLINE));
        let imds = imds_client(cli, mode, deadline, Phase::Config)?;
        let raw = imds.get("/latest/user-data").await.map_err(|e| {
            let kind = imds_failure_kind(&e);
            fail(kind, Phase::Config)(anyhow::Error::new(e).context("reading userData"))
        })?;
        UserDataDocument::read(raw.as_deref().unwrap_or_default())
            .and_then(|read| {
                let refused = read.document().map(Document::refuse_in_user_data);
                refused.unwrap_or(Ok(())).map(|()| read)
            })
            .map_err(|e| fail(Kind::Config, Phase::Config)(e.into()))?
    };
    let (config, ignored) = Config::resolve_layers(user_data, upper)
        .map_err(|e| fail(Kind::Config, Phase::Config)(e.into()))?;
    if let Some(found) = ignored {
        // Not an error: an AMI with a complete local config may run under
        // any userData (a script, a cloud-config, Bottlerocket settings).
        log::info!(
            "userData holds no autonode config ({found}); using {} and flags",
            cli.config_file
        );
    }
    succeeded(
        Phase::Config,
        &format!(
            "server={} cluster={}",
            config.server_url, config.cluster_name
        ),
    );
    Ok(config)
}

fn read_local_file(root: &Root, path: &str) -> anyhow::Result<Document> {
    let path = root.join(path)?;
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Document::parse(&text, &path.display().to_string())?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Document::default()),
        Err(e) => Err(e).with_context(|| path.display().to_string()),
    }
}

fn flag_document(cli: &Cli) -> anyhow::Result<Document> {
    let server_ca = match &cli.server_ca_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("--server-ca-file {}", path.display()))?,
        ),
        None => None,
    };
    Ok(Document {
        server_url: cli.server_url.clone(),
        server_ca,
        server_ca_sha256: cli.server_ca_sha256.clone(),
        cluster_name: cli.cluster_name.clone(),
        options: config::Options {
            deadline: cli.deadline.clone(),
            state_dir: cli.state_dir.clone(),
            ..config::Options::default()
        },
    })
}

/// A second run after success: verify and stop, without joining again.
fn already_joined(run: &mut Run<'_>) -> Result<bool, Failure> {
    let state = run
        .state
        .load()
        .context("state")
        .map_err(fail(Kind::Failed, Phase::Config))?;
    run.resumed = state.completed;
    if state.completed != Some(Phase::Start) {
        if let Some(phase) = state.completed {
            log::info!("resuming after phase={}", phase.as_str());
        }
        return Ok(false);
    }
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    match state::verify_joined(&run.root, now) {
        Ok(()) => {
            log::info!(
                "already joined as {}; nothing to do",
                state.node_name.unwrap_or_default()
            );
            Ok(true)
        }
        Err(problem) => {
            log::warn!("an earlier run joined, but {problem}; setting up again");
            Ok(false)
        }
    }
}

/// IMDS that never answered is the deadline; one that answered wrongly is
/// a failure of this instance.
fn imds_failure_kind(error: &imds::ImdsError) -> Kind {
    use imds::ImdsError::*;
    match error {
        GaveUp { .. } => Kind::Deadline,
        // The operator's to fix, and no retry fixes it.
        TurnedOff { .. } | BadMode { .. } | BadEndpoint(_) => Kind::Config,
        Refused { .. } | Missing(_) | Invalid { .. } => Kind::Failed,
    }
}

/// The IMDS client at the endpoint [`imds::select_endpoint`] picks; the
/// choice is logged once per run.
fn imds_client(
    cli: &Cli,
    config_mode: Option<imds::EndpointMode>,
    deadline: Deadline,
    phase: Phase,
) -> Result<Imds, Failure> {
    let selected = imds::select_endpoint(
        cli.imds_endpoint.as_deref(),
        cli.imds_endpoint_mode.as_deref(),
        config_mode,
        |name| std::env::var(name).ok(),
    )
    .map_err(|e| fail(Kind::Config, phase)(e.into()))?;
    static LOGGED: std::sync::Once = std::sync::Once::new();
    LOGGED.call_once(|| {
        let (endpoint, reason) = (&selected.endpoint, &selected.reason);
        log::info!("IMDS endpoint {endpoint} (from {reason}); never through a proxy");
    });
    Imds::new(&selected.endpoint, deadline)
        .with_context(|| format!("the IMDS endpoint from {}", selected.reason))
        .map_err(fail(Kind::Config, phase))
}

async fn phase_identity(run: &Run<'_>) -> Result<Identity, Failure> {
    started(Phase::Identity);
    let mode = run.config.imds_endpoint_mode;
    let imds = imds_client(run.cli, mode, run.deadline, Phase::Identity)?;
    let identity = imds.identity().await.map_err(|e| {
        let kind = imds_failure_kind(&e);
        fail(kind, Phase::Identity)(anyhow::Error::new(e).context("reading the instance identity"))
    })?;
    succeeded(
        Phase::Identity,
        &format!(
            "instance={} hostname={} ips={:?}",
            identity.provider_id(),
            identity.local_hostname,
            identity.ips
        ),
    );
    Ok(identity)
}

/// keys → join → apply → start. One progress report, at the end: the join
/// request itself tells the server everything earlier reports would, and
/// they would compete with it. A join that keeps failing is reported as
/// `Retrying` (see [`RetryNotices`]); a failure is reported by the caller.
async fn join_and_start(
    run: &mut Run<'_>,
    identity: &Identity,
    client: &ServerClient,
    reporter: &Reporter,
    key_out: &mut Option<KeyPair>,
) -> Result<(), Failure> {
    // Runs while the agent makes keys and waits on the server.
    let probe = probe_kubelet(run)?;
    let (client_key, serving_key) = phase_keys(run)?;
    *key_out = Some(
        KeyPair::from_pem(&client_key.serialize_pem())
            .context("client key")
            .map_err(fail(Kind::Failed, Phase::Keys))?,
    );
    let keys = (&client_key, &serving_key);
    let answer = phase_join(run, identity, client, reporter, keys).await?;

    started(Phase::Apply);
    let keys = kubelet::Keys {
        client: &client_key,
        serving: &serving_key,
    };
    let (units, reload) = apply(run, identity, &answer, &keys, probe)?;
    let written = answer_paths(run)?;
    let written: Vec<&Path> = written.iter().map(PathBuf::as_path).collect();
    record(run, Phase::Apply, Some(&answer.node_name), &written)?;
    succeeded(Phase::Apply, &format!("node={}", answer.node_name));

    started(Phase::Start);
    let start_kubelet = !run.cli.no_start_kubelet;
    kubelet::start(&run.cli.systemctl, &units, reload, start_kubelet)
        .context("starting kubelet")
        .map_err(fail(Kind::Failed, Phase::Start))?;
    record(run, Phase::Start, Some(&answer.node_name), &[])?;
    run.state
        .flush()
        .context("recording progress")
        .map_err(fail(Kind::Failed, Phase::Start))?;
    succeeded(Phase::Start, &format!("node={}", answer.node_name));
    let message = "kubelet started".to_string();
    let key = Some(&client_key);
    reporter.send_later(
        &mut run.reports,
        Phase::Start,
        Outcome::Succeeded,
        message,
        key,
    );
    Ok(())
}

/// The node's two keys, durable before the join can use them.
fn phase_keys(run: &Run<'_>) -> Result<(KeyPair, KeyPair), Failure> {
    started(Phase::Keys);
    let never_used = run.resumed.is_none_or(|phase| phase < Phase::Keys);
    let (client_key, new) = keys::load_or_generate(&run.state.client_key(), never_used)
        .context("client key")
        .map_err(fail(Kind::Failed, Phase::Keys))?;
    let (serving_key, _) = keys::load_or_generate(&run.state.serving_key(), never_used)
        .context("serving key")
        .map_err(fail(Kind::Failed, Phase::Keys))?;
    record(run, Phase::Keys, None, &[])?;
    succeeded(
        Phase::Keys,
        if new { "(new keys)" } else { "(existing keys)" },
    );
    Ok((client_key, serving_key))
}

/// kubelet's files under the root, synced before apply is recorded.
fn answer_paths(run: &Run<'_>) -> Result<Vec<PathBuf>, Failure> {
    kubelet::FILES
        .iter()
        .map(|path| run.root.join(path))
        .collect::<Result<_, _>>()
        .context("kubelet paths")
        .map_err(fail(Kind::Failed, Phase::Apply))
}

fn record(
    run: &Run<'_>,
    phase: Phase,
    node_name: Option<&str>,
    written: &[&Path],
) -> Result<(), Failure> {
    run.state
        .record(phase, node_name, written)
        .context("recording progress")
        .map_err(fail(Kind::Failed, phase))
}

/// A saved answer whose client certificate is still valid, else a join.
async fn phase_join(
    run: &mut Run<'_>,
    identity: &Identity,
    client: &ServerClient,
    reporter: &Reporter,
    (client_key, serving_key): (&KeyPair, &KeyPair),
) -> Result<JoinResponse, Failure> {
    started(Phase::Join);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let saved = run.state.load_response().ok().flatten().filter(|answer| {
        state::not_after(answer.client_certificate.as_bytes()).is_some_and(|expiry| expiry > now)
    });
    if let Some(answer) = saved {
        succeeded(
            Phase::Join,
            &format!("node={} (saved answer)", answer.node_name),
        );
        return Ok(answer);
    }
    let csr_failed = fail(Kind::Failed, Phase::Keys);
    let request = JoinRequest {
        identity: autonode_shared::protocol::InstanceIdentity {
            rsa2048: identity.rsa2048.clone(),
        },
        client_csr: csr::client_csr(client_key, &identity.local_hostname)
            .map_err(|e| csr_failed(e.into()))?,
        serving_csr: csr::serving_csr(serving_key, &identity.local_hostname, &identity.ips)
            .map_err(|e| fail(Kind::Failed, Phase::Keys)(e.into()))?,
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let asked = std::time::Instant::now();
    // A join that keeps failing is news for the NodeClaim (an Event), so
    // that "retrying, and why" is visible without the node's console.
    let (deadline, reports) = (run.deadline, &mut run.reports);
    let mut notices = RetryNotices::default();
    let observe = |retrying: &Retrying<'_, JoinError>| {
        if notices.due(retrying.attempt, tokio::time::Instant::now()) {
            let message = format!(
                "attempt {} failed: {}; retrying in {:.0}s",
                retrying.attempt,
                retrying.error,
                retrying.delay.as_secs_f64()
            );
            let key = Some(client_key);
            reporter.send_later(reports, Phase::Join, Outcome::Retrying, message, key);
        }
    };
    let answer = client
        .join(&request, &deadline, observe)
        .await
        .map_err(|e| {
            let kind = match e {
                JoinError::Refused { .. } | JoinError::BadResponse(_) => Kind::Refused,
                JoinError::GaveUp { .. } => Kind::Deadline,
                JoinError::Trust(_) => Kind::Config,
                JoinError::Transient(_) => Kind::Failed,
            };
            fail(kind, Phase::Join)(anyhow::Error::new(e).context("joining"))
        })?;
    log::debug!("the server answered in {:?}", asked.elapsed());
    run.state
        .save_response(&answer)
        .context("saving the join answer")
        .map_err(fail(Kind::Failed, Phase::Join))?;
    record(run, Phase::Join, Some(&answer.node_name), &[])?;
    succeeded(Phase::Join, &format!("node={}", answer.node_name));
    Ok(answer)
}

/// `kubelet --version` of the kubelet under the root, or its cached answer
/// ([`kubelet::Probe`]).
fn probe_kubelet(run: &Run<'_>) -> Result<kubelet::Probe, Failure> {
    let program = run
        .root
        .join(&run.cli.kubelet_path)
        .context("--kubelet-path")
        .map_err(fail(Kind::Config, Phase::Apply))?;
    let cache = run
        .root
        .join(&run.config.state_dir.to_string_lossy())
        .context("state-dir")
        .map_err(fail(Kind::Config, Phase::Config))?
        .join(kubelet::VERSION_CACHE);
    Ok(kubelet::Probe::start(&program, &cache))
}

/// Ignition, kubelet's files, kubelet enabled. The units to start, and
/// whether systemd must reload first.
fn apply(
    run: &Run<'_>,
    identity: &Identity,
    answer: &JoinResponse,
    keys: &kubelet::Keys<'_>,
    probe: kubelet::Probe,
) -> Result<(Vec<String>, bool), Failure> {
    let applied = ignition::apply(&run.root, &answer.ignition).map_err(|e| {
        let kind = if e.is_refusal() {
            Kind::Refused
        } else {
            Kind::Failed
        };
        fail(kind, Phase::Apply)(anyhow::Error::new(e).context("applying the Ignition config"))
    })?;
    log::info!(
        "ignition: {} entries changed; enabled units {:?}",
        applied.changed,
        applied.enabled_units
    );
    let asked = std::time::Instant::now();
    let kubelet::Answer { version, found } = probe
        .finish()
        .context("finding kubelet's version")
        .map_err(fail(Kind::Failed, Phase::Apply))?;
    // key=value, for the VM test's timings (tests/tests/integration/vm.rs).
    log::info!(
        "kubelet version={version} from={} took_s={:.3} waited_s={:.3}",
        found.name(),
        found.took().as_secs_f64(),
        asked.elapsed().as_secs_f64()
    );
    let kubelet = kubelet::Kubelet {
        path: &run.cli.kubelet_path,
        version,
    };
    let changed = kubelet::write(&run.root, answer, keys, identity, kubelet).map_err(|e| {
        let kind = if matches!(e, KubeletError::Refused(_)) {
            Kind::Refused
        } else {
            Kind::Failed
        };
        fail(kind, Phase::Apply)(anyhow::Error::new(e).context("writing kubelet's files"))
    })?;
    log::info!("kubelet: {changed} files changed");
    units::enable(&run.root, kubelet::UNIT, Durability::Deferred)
        .context("enabling kubelet.service")
        .map_err(fail(Kind::Failed, Phase::Apply))?;
    let retired = kubelet::retire_old_dropin(&run.root)
        .context("removing an older agent's kubelet drop-in")
        .map_err(fail(Kind::Failed, Phase::Apply))?;
    let reload = retired || kubelet::ignition_touches_units(&answer.ignition);
    Ok((applied.enabled_units, reload))
}
