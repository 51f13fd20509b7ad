//! `autonode-server serve` settings (and the userData flags `render-userdata`
//! shares with it): flags, environment, and a file.
//!
//! Precedence, highest first: a flag on the command line, its environment
//! variable (`AUTONODE_…`), the `--config` TOML file, the default. The file
//! uses the flags' long names as keys (`allowed-accounts = ["1234…"]`);
//! an unknown key is an error naming it.

use anyhow::{bail, Context, Result};
use autonode_server::controllers::nodeclass::userdata::{CaForm, UserDataSettings};
use clap::{Args, CommandFactory, ValueEnum};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Settings of the `serve` command.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// TOML file with defaults for any of these settings (keys are the long
    /// flag names).
    #[arg(long, env = "AUTONODE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Address of the join API (HTTPS).
    #[arg(long, env = "AUTONODE_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,

    /// PEM certificate (chain) the join API serves; reloaded when it changes.
    #[arg(long, env = "AUTONODE_TLS_CERT")]
    pub tls_cert: PathBuf,

    /// PEM private key of --tls-cert; reloaded when it changes.
    #[arg(long, env = "AUTONODE_TLS_KEY")]
    pub tls_key: PathBuf,

    /// Address for /metrics, /healthz and /readyz (plain HTTP).
    #[arg(long, env = "AUTONODE_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,

    /// Kubeconfig of the guest cluster (the server runs outside it).
    #[arg(long, env = "AUTONODE_KUBECONFIG")]
    pub kubeconfig: PathBuf,

    /// API server URL nodes are given; default: the kubeconfig's.
    #[arg(long, env = "AUTONODE_API_SERVER_URL")]
    pub api_server_url: Option<String>,

    /// PEM CA bundle nodes trust for the API server; default: the
    /// kubeconfig's certificate-authority data.
    #[arg(long, env = "AUTONODE_CLUSTER_CA_FILE")]
    pub cluster_ca_file: Option<PathBuf>,

    /// Requests the server has in flight to the guest cluster's API server
    /// at once, watches apart; more wait their turn in order of arrival.
    /// The server's client speaks HTTP/1.1, a connection (and a TLS
    /// handshake on both sides) for each request in flight: without a
    /// bound a burst of joins opened hundreds, which the API server answers
    /// no faster than it has cores (docs/benchmarks.md, "Issue 51, eighth
    /// step"). Raise it for an API server with many cores and a high
    /// --max-mutating-requests-inflight.
    #[arg(
        long,
        env = "AUTONODE_KUBE_API_IN_FLIGHT",
        default_value = "64",
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub kube_api_in_flight: u16,

    /// AWS accounts whose instances may join (comma-separated). Empty
    /// refuses everyone.
    #[arg(
        long,
        env = "AUTONODE_ALLOWED_ACCOUNTS",
        value_delimiter = ',',
        required = true
    )]
    pub allowed_accounts: Vec<String>,

    /// AWS regions whose instances may join (comma-separated).
    #[arg(
        long,
        env = "AUTONODE_ALLOWED_REGIONS",
        value_delimiter = ',',
        required = true
    )]
    pub allowed_regions: Vec<String>,

    /// Oldest instance pendingTime accepted, in seconds before now.
    #[arg(
        long = "max-instance-age",
        env = "AUTONODE_MAX_INSTANCE_AGE",
        default_value = "900",
        value_name = "SECONDS"
    )]
    pub max_instance_age_secs: u64,

    /// How far pendingTime may be ahead of this server's clock, in seconds.
    #[arg(
        long = "clock-skew",
        env = "AUTONODE_CLOCK_SKEW",
        default_value = "60",
        value_name = "SECONDS"
    )]
    pub clock_skew_secs: u64,

    /// Extra pinned identity certificates: a directory of `<region>.pem` /
    /// `any.pem` files, added to AWS's built-in ones.
    #[arg(long, env = "AUTONODE_IDENTITY_CERTS")]
    pub identity_certs: Option<PathBuf>,

    /// EC2 endpoint override (default: the regional AWS endpoint).
    #[arg(long, env = "AUTONODE_EC2_ENDPOINT")]
    pub ec2_endpoint: Option<String>,

    /// `DescribeInstances` calls a second, per region, and the burst: the
    /// server's share of the account's EC2 request budget. The default (10)
    /// is half of AWS's default refill for the account, leaving the rest to
    /// Karpenter; lookups waiting for the budget go together, up to 50
    /// instances a call, so 10 a second is 500 lookups a second. Raise it
    /// only with the account's raised limit: throttled, the server's
    /// lookups and Karpenter's launches fail together.
    #[arg(long, env = "AUTONODE_EC2_CALLS_PER_SECOND", default_value = "10", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub ec2_calls_per_second: u32,

    /// Cluster DNS service IPs written into every kubelet config.
    #[arg(
        long,
        env = "AUTONODE_CLUSTER_DNS",
        value_delimiter = ',',
        default_value = "10.96.0.10"
    )]
    pub cluster_dns: Vec<String>,

    /// Cluster DNS domain.
    #[arg(long, env = "AUTONODE_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,

    /// Namespace (in the guest cluster) of the ConfigMaps and Secrets
    /// holding Ignition configs: the base one and those EC2NodeClasses name
    /// in their `autonode.dev/ignition` annotation.
    #[arg(
        long,
        env = "AUTONODE_IGNITION_NAMESPACE",
        default_value = "autonode-system"
    )]
    pub ignition_namespace: String,

    /// Where the Ignition config every node gets is (in
    /// --ignition-namespace, key `config.ign`): `<name>` or
    /// `configmap/<name>` for a ConfigMap, `secret/<name>` for a Secret.
    /// EC2NodeClasses' configs and autonode's own files are merged over it.
    #[arg(
        long,
        env = "AUTONODE_BASE_IGNITION",
        value_name = "[configmap/|secret/]NAME",
        value_parser = autonode_server::join::render::inputs::Source::parse
    )]
    pub base_ignition: Option<autonode_server::join::render::inputs::Source>,

    /// Read Ignition configs from Secrets too (`secret/<name>`). Turn it
    /// off when every config is in a ConfigMap: the server then never
    /// lists or watches Secrets, and packaging/guest/rbac-ignition-secrets.yaml
    /// (which grants every Secret in --ignition-namespace: RBAC cannot
    /// narrow a watch) can be left out.
    #[arg(long, env = "AUTONODE_IGNITION_SECRETS", default_value = "true", action = clap::ArgAction::Set)]
    pub ignition_secrets: bool,

    /// Seconds to wait for kube-controller-manager to sign a CSR.
    #[arg(
        long = "csr-timeout",
        env = "AUTONODE_CSR_TIMEOUT",
        default_value = "60",
        value_name = "SECONDS"
    )]
    pub csr_timeout_secs: u64,

    /// Seconds the certificates a join issues last (the CSRs'
    /// `expirationSeconds`; at least 600, the signer's floor). kubelet
    /// renews them at 70 to 90 % of this through the renewal approver.
    #[arg(
        long = "join-certificate-lifetime",
        env = "AUTONODE_JOIN_CERTIFICATE_LIFETIME",
        default_value_t = autonode_server::kube::issuer::DEFAULT_JOIN_LIFETIME.as_secs(),
        value_name = "SECONDS",
        value_parser = clap::value_parser!(u64).range(600..=i32::MAX as u64)
    )]
    pub join_certificate_lifetime_secs: u64,

    /// kube-controller-manager's `--cluster-signing-duration`, in seconds:
    /// the longest a kubelet certificate lasts (kubelet's renewals ask for
    /// no lifetime). A node name EC2 gave another instance within this long
    /// has its kubelet CSRs left pending (`name_reused`).
    #[arg(
        long = "signing-duration",
        env = "AUTONODE_SIGNING_DURATION",
        default_value_t = autonode_server::kube::issuer::DEFAULT_SIGNING_DURATION.as_secs(),
        value_name = "SECONDS",
        value_parser = clap::value_parser!(u64).range(600..=i32::MAX as u64)
    )]
    pub signing_duration_secs: u64,

    /// Delete a NodeClaim whose machine failed for good (its agent's signed
    /// fatal report, or its join refused for a reason no retry changes), so
    /// Karpenter replaces the machine at once rather than after its
    /// 15-minute registration timeout. `false` marks it failed instead (the
    /// AutonodeBootstrapped condition says why) and keeps it.
    #[arg(long, env = "AUTONODE_DELETE_FAILED_NODECLAIMS", default_value = "true", action = clap::ArgAction::Set)]
    pub delete_failed_nodeclaims: bool,

    /// Failures of one group (NodePool, EC2NodeClass and reason) deleted
    /// at once while no machine of the NodePool and class has become Ready
    /// since: one bad machine is replaced in seconds, but past this many
    /// in a row the failure is a pattern (a broken userData or AMI), and
    /// later NodeClaims of the group are marked failed and kept, so
    /// Karpenter's registration timeout replaces them (a launch per
    /// machine per 15 minutes, not one every few seconds). A Warning Event
    /// on the NodePool and EC2NodeClass says so. 0 never deletes (as
    /// `--delete-failed-nodeclaims=false` but for impostor Nodes). Causes
    /// on the server's side (allow-lists, clocks) never delete.
    #[arg(
        long,
        env = "AUTONODE_FAILURE_BUDGET",
        default_value_t = autonode_server::kube::budget::DEFAULT_LIMIT,
        value_name = "FAILURES"
    )]
    pub failure_budget: u32,

    /// Refuse joins from agents older than this release (MAJOR.MINOR.PATCH,
    /// e.g. 0.3.0), with the reason `agent_below_minimum`: the machine is
    /// replaced like any machine that can never join (within
    /// --failure-budget: past it, a fleet still booting the old AMI is
    /// marked, kept and said once), and the Event, the server's log and
    /// the agent's own log say which agent to bake. Nodes that already
    /// joined are not touched. Unset: every agent the wire format serves
    /// (docs/upgrading.md, "Which agents a server serves").
    #[arg(long, env = "AUTONODE_MIN_AGENT_VERSION", value_name = "VERSION")]
    pub min_agent_version: Option<autonode_server::join::agents::MinVersion>,

    /// YAML file naming the EC2NodeClasses whose machines must prove their
    /// boot with a NitroTPM attestation document, and the measurements
    /// (PCR values, from the bake's measurements.yaml) each admits
    /// (docs/operations.md, "Attested joins"). Read at start (a bad file
    /// stops the server) and every 10 s after: a bad change is logged as
    /// an error and the policy before it kept. Kept here, where autonode's
    /// operator writes, never on the class: a class editor cannot turn it
    /// off. Unset: no class must attest, and every join is judged as
    /// before.
    #[arg(long, env = "AUTONODE_ATTESTATION_POLICY", value_name = "FILE")]
    pub attestation_policy: Option<PathBuf>,

    /// PEM certificate of the Nitro attestation root that NitroTPM
    /// documents must chain to. Default: AWS's "aws.nitro-enclaves" root
    /// (G1), built in. Only tests (a test PKI standing in for AWS's) have
    /// reason to set it.
    #[arg(long, env = "AUTONODE_NITRO_ROOT", value_name = "FILE")]
    pub nitro_root: Option<PathBuf>,

    /// Approve the CSRs kubelet makes itself (client renewals, serving
    /// certificates) when they match the node's NodeClaim and EC2 facts.
    #[arg(long, env = "AUTONODE_APPROVE_KUBELET_CSRS", default_value = "true", action = clap::ArgAction::Set)]
    pub approve_kubelet_csrs: bool,

    /// Kubelet CSRs one node may have pending or approved in the last 15
    /// minutes before more are left pending (approvals count too, so a
    /// node making CSRs in a loop gets no more than this). A kubelet makes
    /// two per certificate rotation (client, serving), now and then a retry.
    #[arg(long, env = "AUTONODE_PENDING_CSR_CAP", default_value = "5")]
    pub pending_csr_cap: usize,

    /// Namespace (in the guest cluster) of the leader election Lease.
    #[arg(
        long,
        env = "AUTONODE_LEADER_NAMESPACE",
        default_value = "autonode-system"
    )]
    pub leader_namespace: String,

    /// Seconds a leader's Lease lasts unrenewed before another replica
    /// takes over the controllers. The leader renews every third of it; one
    /// that has not renewed within two thirds of it (the API server
    /// unreachable or not answering) stops leading first, so two never
    /// overlap.
    #[arg(
        long = "leader-lease",
        env = "AUTONODE_LEADER_LEASE",
        default_value = "15",
        value_name = "SECONDS"
    )]
    pub leader_lease_secs: u64,

    /// How much smaller than its NodeClaim's allocatable (what Karpenter
    /// planned with) a Ready node's cpu, memory, pods or ephemeral-storage
    /// may be, in percent of the NodeClaim's, before a CapacityShortfall
    /// Warning names the resource and the EC2NodeClass's spec.kubelet field
    /// to set. Not 0: Karpenter's memory figure is an estimate (the instance
    /// type's memory less a fixed VM overhead share) that real instances
    /// miss by a little; the mismatches this is for (maxPods, kubeReserved,
    /// evictionHard not stated in the class) are larger. 100 turns it off.
    #[arg(
        long = "capacity-tolerance",
        env = "AUTONODE_CAPACITY_TOLERANCE",
        default_value_t = autonode_server::controllers::capacity::DEFAULT_TOLERANCE_PERCENT,
        value_name = "PERCENT",
        value_parser = clap::value_parser!(u32).range(0..=100)
    )]
    pub capacity_tolerance_percent: u32,

    /// Name of this replica in Events (the pod name in Kubernetes).
    #[arg(long, env = "POD_NAME", default_value = "autonode-server")]
    pub instance_name: String,

    /// Log format: `text` or `json` (one JSON object per line).
    #[arg(long, env = "AUTONODE_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Threads that run the server's work: the join API, the watches and
    /// the leader's controllers (blocking work has threads of its own
    /// either way). One keeps up with what an API server can take: a join
    /// costs the server about 3 ms of CPU, and in a burst the API server
    /// is the limit; each wake-up handed between threads costs CPU too (in
    /// docs/benchmarks.md, "The third pass", one thread used 2 to 12% less
    /// CPU a join than two, and refused a flood of foreign documents with
    /// the joins beside it no slower). Raise it on a host with cores to
    /// spare for a server that must refuse floods from many sources (each
    /// refusal verifies a signature).
    #[arg(
        long,
        env = "AUTONODE_WORKER_THREADS",
        default_value = "1",
        value_parser = clap::value_parser!(u16).range(1..=256)
    )]
    pub worker_threads: u16,

    /// Check the settings (flags, environment, --config file) as serve
    /// does before it starts, then exit: 0 when serve would accept them.
    /// Reads none of the files they name and connects nowhere, so it can
    /// vet a Deployment's or a chart's args anywhere.
    #[arg(long)]
    pub check_config: bool,

    /// What userData tells nodes (shared with `render-userdata`).
    #[command(flatten)]
    pub user_data: UserDataArgs,

    /// EC2NodeClass upkeep and the Karpenter CRDs.
    #[command(flatten)]
    pub nodeclasses: NodeClassArgs,

    /// The join API's caps and timeouts.
    #[command(flatten)]
    pub join_api: JoinApiArgs,
}

impl ServeArgs {
    pub fn max_instance_age(&self) -> Duration {
        Duration::from_secs(self.max_instance_age_secs)
    }
    pub fn clock_skew(&self) -> Duration {
        Duration::from_secs(self.clock_skew_secs)
    }
    pub fn csr_timeout(&self) -> Duration {
        Duration::from_secs(self.csr_timeout_secs)
    }
    pub fn certificate_lifetimes(&self) -> autonode_server::kube::issuer::Lifetimes {
        autonode_server::kube::issuer::Lifetimes {
            join: Duration::from_secs(self.join_certificate_lifetime_secs),
            signing: Duration::from_secs(self.signing_duration_secs),
        }
    }
    pub fn capacity_tolerance(&self) -> autonode_server::controllers::capacity::Tolerance {
        autonode_server::controllers::capacity::Tolerance::percent(self.capacity_tolerance_percent)
    }

    /// What serve refuses beyond each value's own form (which clap checks):
    /// combinations, and values parsed only when a feature uses them.
    /// Reads no file: `--check-config` runs only this.
    pub fn check(&self) -> Result<()> {
        use autonode_server::join::render::inputs::Source;
        if let (Some(Source::Secret(name)), false) = (&self.base_ignition, self.ignition_secrets) {
            bail!(
                "--base-ignition names Secret {name}, but --ignition-secrets=false: keep the base config in a ConfigMap, or turn Secrets on"
            );
        }
        autonode_server::controllers::nodeclass::ami_selector_terms(&self.nodeclasses.ami_ids)
            .context("--ami-ids")?;
        if let Some(selector) = &self.nodeclasses.nodeclass_selector {
            bail!(
                "--nodeclass-selector ({selector:?}) was removed: whoever may edit an EC2NodeClass \
                 could remove the label and so switch the upkeep of that class off. Name the \
                 classes to keep with --nodeclass-names instead (names cannot change)"
            );
        }
        Ok(())
    }
}

/// Expands `--config FILE` into flags placed before the real arguments.
/// A key whose flag is also on the command line, or whose environment
/// variable is set, is skipped: flags win over the environment, and both
/// over the file. (Splicing both would not let the later win: clap refuses
/// a single-valued flag given twice.)
pub fn expand_config_file<C: CommandFactory>(args: Vec<OsString>) -> Result<Vec<OsString>> {
    let Some(path) = config_path(&args) else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("parsing config file {}", path.display()))?;
    let command = C::command();
    let serve = command
        .find_subcommand("serve")
        .context("no serve subcommand")?;
    let mut injected = Vec::new();
    for (key, value) in table {
        let arg = serve
            .get_arguments()
            // Neither names a setting: the file itself, the check-only mode.
            .find(|a| {
                a.get_long() == Some(key.as_str())
                    && !["config", "check-config"].contains(&key.as_str())
            })
            .with_context(|| format!("{}: unknown setting `{key}`", path.display()))?;
        if given_as_flag(&args, &key)
            || arg
                .get_env()
                .is_some_and(|env| std::env::var_os(env).is_some())
        {
            continue;
        }
        injected.push(OsString::from(format!(
            "--{key}={}",
            flag_value(&key, &value)?
        )));
    }
    // Insert right after the subcommand name so they parse as its flags.
    let at = args
        .iter()
        .position(|a| a == "serve")
        .map_or(args.len(), |i| i + 1);
    let mut out = args;
    out.splice(at..at, injected);
    Ok(out)
}

/// `--agent-deadline`: whole seconds, within the agent's own range (the
/// contract's check, so `--check-config` refuses what the agent would).
fn agent_deadline(value: &str) -> std::result::Result<u64, String> {
    let seconds: u64 = value.parse().map_err(|e| format!("{e}"))?;
    autonode_shared::agentconfig::check_deadline(Duration::from_secs(seconds))
        .map_err(|e| e.to_string())?;
    Ok(seconds)
}

/// Whether `--key` (or `--key=…`) is among the arguments.
fn given_as_flag(args: &[OsString], key: &str) -> bool {
    let flag = format!("--{key}");
    args.iter().any(|arg| {
        let text = arg.to_string_lossy();
        text == flag.as_str()
            || text
                .strip_prefix(flag.as_str())
                .is_some_and(|rest| rest.starts_with('='))
    })
}

fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy();
        if let Some(path) = text.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
        if text == "--config" {
            return iter.next().map(PathBuf::from);
        }
    }
    std::env::var_os("AUTONODE_CONFIG").map(PathBuf::from)
}

fn flag_value(key: &str, value: &toml::Value) -> Result<String> {
    Ok(match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Array(items) => items
            .iter()
            .map(|v| flag_value(key, v))
            .collect::<Result<Vec<_>>>()?
            .join(","),
        other => bail!("setting `{key}`: unsupported value {other}"),
    })
}

/// Reads a file that must exist, with the path in the error.
pub fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// What nodes are told in userData: shared by `serve` and `render-userdata`.
#[derive(Debug, Clone, Args)]
pub struct UserDataArgs {
    /// The join API's URL as nodes reach it, e.g.
    /// https://autonode.example.com:8443 (goes into userData).
    #[arg(long, env = "AUTONODE_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// PEM of the CA that signs --tls-cert (goes into userData as its
    /// SHA-256 pin, or as PEM with --join-ca-form=pem).
    #[arg(long, env = "AUTONODE_JOIN_CA_FILE")]
    pub join_ca_file: Option<PathBuf>,

    /// How userData names the join CA: `pin` (sha256 of its DER; short,
    /// needs the CA in the served chain) or `pem` (the certificates).
    #[arg(long, env = "AUTONODE_JOIN_CA_FORM", value_enum, default_value = "pin")]
    pub join_ca_form: JoinCaForm,

    /// The cluster's name, as the agent reports it (goes into userData).
    #[arg(long, env = "AUTONODE_CLUSTER_NAME")]
    pub cluster_name: Option<String>,

    /// The agent's overall deadline in seconds (at most 900); the agent's
    /// default (600) when unset.
    #[arg(
        long = "agent-deadline",
        env = "AUTONODE_AGENT_DEADLINE",
        value_name = "SECONDS",
        value_parser = agent_deadline
    )]
    pub agent_deadline_secs: Option<u64>,
}

/// `--join-ca-form` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JoinCaForm {
    Pin,
    Pem,
}

impl UserDataArgs {
    /// Whether any setting that only userData needs was given.
    pub fn is_set(&self) -> bool {
        self.public_url.is_some() || self.join_ca_file.is_some() || self.cluster_name.is_some()
    }

    /// The validated settings; every one of the three must be given.
    pub fn settings(&self) -> Result<UserDataSettings> {
        let missing = |flag: &str| format!("{flag} is required to render userData");
        let url = self
            .public_url
            .as_deref()
            .with_context(|| missing("--public-url"))?;
        let ca_file = self
            .join_ca_file
            .as_deref()
            .with_context(|| missing("--join-ca-file"))?;
        let name = self
            .cluster_name
            .as_deref()
            .with_context(|| missing("--cluster-name"))?;
        let form = match self.join_ca_form {
            JoinCaForm::Pin => CaForm::Pin,
            JoinCaForm::Pem => CaForm::Pem,
        };
        let deadline = self.agent_deadline_secs.map(Duration::from_secs);
        Ok(UserDataSettings::new(
            url,
            &read(ca_file)?,
            form,
            name,
            deadline,
        )?)
    }
}

/// `serve`'s settings for Karpenter's objects: EC2NodeClass upkeep
/// (`autonode_server::controllers::nodeclass`) and CRD installation.
#[derive(Debug, Clone, Args)]
pub struct NodeClassArgs {
    /// Keep EC2NodeClasses' userData, amiFamily (Custom), the instance
    /// metadata options (see --enforce-metadata-options) and, with
    /// --ami-ids, amiSelectorTerms as rendered. Needs --public-url,
    /// --join-ca-file and --cluster-name; without them it stays off.
    #[arg(long, env = "AUTONODE_MANAGE_NODECLASSES", default_value = "true", action = clap::ArgAction::Set)]
    pub manage_nodeclasses: bool,

    /// Keep only the EC2NodeClasses of these names (comma-separated;
    /// default all). Chosen by name because a name cannot change after
    /// the class is created: whoever may edit a class cannot take it out
    /// of the upkeep, as they could by removing a label.
    #[arg(
        long,
        env = "AUTONODE_NODECLASS_NAMES",
        value_delimiter = ',',
        value_name = "NAMES"
    )]
    pub nodeclass_names: Vec<String>,

    /// Removed: a label selector let whoever may edit a class switch its
    /// upkeep off by removing the label. Refused at start, so that a
    /// server given it never silently keeps every class instead.
    #[arg(long, env = "AUTONODE_NODECLASS_SELECTOR", hide = true)]
    pub nodeclass_selector: Option<String>,

    /// AMIs with the agent, per architecture (comma-separated
    /// `arch=ami-id`, e.g. amd64=ami-0123,arm64=ami-0456); kept as the
    /// classes' amiSelectorTerms. Unset: amiSelectorTerms are left alone.
    #[arg(long, env = "AUTONODE_AMI_IDS", value_delimiter = ',')]
    pub ami_ids: Vec<String>,

    /// Keep EC2NodeClasses' spec.metadataOptions at httpTokens: required
    /// (IMDSv2 only), httpPutResponseHopLimit: 1 and httpEndpoint: enabled
    /// (other keys are left alone). Turning this off is a risk: a class
    /// with httpTokens optional or a hop limit over 1 lets every pod on its
    /// nodes read the instance identity document, the credential a machine
    /// joins with, and the node's IAM role credentials. When off, the
    /// classes keep the values they have and a class that exposes IMDS to
    /// pods gets a Warning Event.
    #[arg(long, env = "AUTONODE_ENFORCE_METADATA_OPTIONS", default_value = "true", action = clap::ArgAction::Set)]
    pub enforce_metadata_options: bool,

    /// Seconds between comparisons of an unchanged EC2NodeClass.
    #[arg(
        long = "nodeclass-resync",
        env = "AUTONODE_NODECLASS_RESYNC",
        default_value = "300",
        value_name = "SECONDS",
        hide = true
    )]
    pub nodeclass_resync_secs: u64,

    /// Rollout guard: when the upkeep changes a class's AMI or userData,
    /// this many NodeClaims launched under the new values failing (a fatal
    /// agent report, a refusal that dooms the instance, deleted or not
    /// Ready within --rollout-ready-deadline) with none Ready puts the last
    /// good values back; they are not applied again until the class's
    /// autonode.dev/retry-rollout annotation gets a new value or the flags
    /// render other values.
    #[arg(
        long = "rollout-failures",
        env = "AUTONODE_ROLLOUT_FAILURES",
        default_value = "3",
        value_name = "COUNT",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub rollout_failures: u32,

    /// Rollout guard: seconds a NodeClaim launched under new AMI or
    /// userData has to become Ready before it counts as failed. Karpenter
    /// itself gives up on a NodeClaim that has not registered after 15
    /// minutes.
    #[arg(
        long = "rollout-ready-deadline",
        env = "AUTONODE_ROLLOUT_READY_DEADLINE",
        default_value = "1200",
        value_name = "SECONDS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub rollout_ready_deadline_secs: u64,

    /// File with the replicas' sealing key (at least 32 random bytes): it
    /// authenticates what autonode must rely on and others could write (the
    /// rollout guard's state on each EC2NodeClass, autonode's marks on
    /// NodeClaims), so that whoever may edit those objects cannot forge or
    /// erase it. Every replica must read the same key (e.g. one Secret), and
    /// it must outlive the serving certificate. Unset: a key derived from
    /// the --tls-key file, which changes with every new TLS private key
    /// (warned at start).
    #[arg(
        long = "seal-key-file",
        env = "AUTONODE_SEAL_KEY_FILE",
        value_name = "PATH",
        conflicts_with = "rollout_state_key_file"
    )]
    pub seal_key_file: Option<std::path::PathBuf>,

    /// Files with earlier sealing keys (comma-separated, at most 4): seals
    /// made under them still open, and are made again under the current
    /// key when autonode next writes what they seal. Each file may be an
    /// earlier --seal-key-file or the --tls-key file a server without
    /// --seal-key-file derived its key from. A file that is not there is
    /// skipped (logged).
    #[arg(
        long = "previous-seal-key-file",
        env = "AUTONODE_PREVIOUS_SEAL_KEY_FILE",
        value_name = "PATH",
        value_delimiter = ','
    )]
    pub previous_seal_key_files: Vec<std::path::PathBuf>,

    /// Deprecated: the old name of --seal-key-file (the same file gives the
    /// same key under either name); warned at start.
    #[arg(
        long = "rollout-state-key-file",
        env = "AUTONODE_ROLLOUT_STATE_KEY_FILE",
        value_name = "PATH"
    )]
    pub rollout_state_key_file: Option<std::path::PathBuf>,

    /// Install or update the Karpenter CRDs in the guest cluster at start
    /// (needs packaging/guest/rbac-install-crds.yaml).
    #[arg(long, env = "AUTONODE_INSTALL_CRDS", default_value = "false", num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub install_crds: bool,
}

impl NodeClassArgs {
    /// The controller's settings, or `None` when upkeep is off (disabled,
    /// or the userData settings are not given).
    pub fn settings(
        &self,
        node: &UserDataArgs,
        metrics: &autonode_server::kube::metrics::Metrics,
        events: &autonode_server::kube::events::Events,
        key: autonode_server::kube::seal::StateKey,
        clock: autonode_server::primitives::clock::Clock,
        store_namespace: &str,
    ) -> Result<Option<autonode_server::controllers::nodeclass::Settings>> {
        use autonode_server::controllers::nodeclass::{
            ami_selector_terms, Desired, MetadataOptionsPolicy, Settings,
        };
        if !self.manage_nodeclasses {
            return Ok(None);
        }
        if !node.is_set() {
            tracing::warn!("EC2NodeClass upkeep is off: --public-url, --join-ca-file and --cluster-name are not set");
            return Ok(None);
        }
        let user_data =
            autonode_server::controllers::nodeclass::userdata::Rendered::new(&node.settings()?);
        let ami_terms = ami_selector_terms(&self.ami_ids).context("--ami-ids")?;
        let metadata_options = if self.enforce_metadata_options {
            MetadataOptionsPolicy::Enforce
        } else {
            tracing::warn!(
                "--enforce-metadata-options=false: EC2NodeClasses' metadataOptions are not kept; \
                 a class with httpTokens optional or httpPutResponseHopLimit over 1 lets every pod \
                 on its nodes read the instance identity document (the credential a machine joins \
                 with) and the node's IAM role credentials"
            );
            MetadataOptionsPolicy::LeaveAlone
        };
        Ok(Some(Settings {
            desired: Desired {
                user_data,
                ami_terms,
                metadata_options,
            },
            names: self.nodeclass_names.iter().cloned().collect(),
            resync: Duration::from_secs(self.nodeclass_resync_secs.max(1)),
            metrics: metrics.clone(),
            events: events.clone(),
            rollout: autonode_server::controllers::nodeclass::rollout::Settings {
                failures: usize::try_from(self.rollout_failures).unwrap_or(usize::MAX),
                ready_deadline: Duration::from_secs(self.rollout_ready_deadline_secs),
                key,
                clock,
            },
            store_namespace: store_namespace.to_string(),
        }))
    }

    /// The replicas' sealing key ring (the rollout state's, and NodeClaim
    /// marks'): from --seal-key-file (or its old name), else derived from
    /// the TLS key's file; with the --previous-seal-key-file keys.
    pub fn state_key(
        &self,
        tls_key: &std::path::Path,
    ) -> Result<autonode_server::kube::seal::StateKey> {
        use autonode_server::kube::seal::StateKey;
        if self.rollout_state_key_file.is_some() {
            tracing::warn!(
                "--rollout-state-key-file (AUTONODE_ROLLOUT_STATE_KEY_FILE) is deprecated: \
                 name the same file with --seal-key-file (AUTONODE_SEAL_KEY_FILE)"
            );
        }
        let key = match self
            .seal_key_file
            .as_ref()
            .or(self.rollout_state_key_file.as_ref())
        {
            Some(path) => StateKey::from_key_file(path).context("--seal-key-file")?,
            None => {
                tracing::warn!(
                    "sealing key derived from --tls-key (--seal-key-file is unset): a new TLS \
                     private key (cert-manager makes one at every renewal by default) voids every \
                     seal at the next restart: NodeClaim marks (a reused node name's window) and \
                     the rollout guard's state are forgotten, and replicas started on either side \
                     of a renewal seal with different keys. Set --seal-key-file (the chart makes \
                     one), with this TLS key file as --previous-seal-key-file"
                );
                StateKey::from_tls_key(tls_key).context("--tls-key, for the sealing key")?
            }
        };
        previous_keys(key, &self.previous_seal_key_files)
    }
}

/// `key` with each of `files` as a previous key; a file not there is
/// skipped (a fresh install has none).
fn previous_keys(
    mut key: autonode_server::kube::seal::StateKey,
    files: &[std::path::PathBuf],
) -> Result<autonode_server::kube::seal::StateKey> {
    for path in files {
        if !path.exists() {
            tracing::info!(path = %path.display(), "no previous sealing key there: none opens its seals");
            continue;
        }
        key = key
            .with_previous_file(path)
            .context("--previous-seal-key-file")?;
    }
    if key.previous_keys() > 0 {
        tracing::info!(
            keys = key.previous_keys(),
            "seals made under the previous sealing keys open, and are made again under the \
             current key when next written"
        );
    }
    Ok(key)
}

/// `serve`'s caps and timeouts for the join API (`autonode_server::front::api`):
/// what one caller, one source address and everyone together may hold.
#[derive(Debug, Clone, Args)]
pub struct JoinApiArgs {
    /// Joins processed at once, once admitted (body read, document verified
    /// and within the allowed accounts and regions); more wait their turn
    /// (see --join-queue-wait), then get 503 with Retry-After.
    #[arg(long, env = "AUTONODE_MAX_CONCURRENT_JOINS", default_value = "256", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_joins: u32,

    /// Seconds an admitted join waits, in order of arrival, for a place
    /// under --max-concurrent-joins before it is answered 503 with
    /// Retry-After. In a burst, a join waiting here starts the moment a
    /// place frees, where one sent away waits out its backoff and pays its
    /// TLS handshake and admission again. When more joins wait already than
    /// places free up in this time (at the rate they have been freeing), a
    /// newcomer is answered 503 at once, with a Retry-After at its turn (at
    /// most 30 s, one place's time after the one told before it). At most
    /// 40: every agent waits 60 s for an answer, and the join itself needs
    /// the rest. 0: no waiting.
    #[arg(
        long = "join-queue-wait",
        env = "AUTONODE_JOIN_QUEUE_WAIT",
        default_value = "10",
        value_name = "SECONDS",
        value_parser = clap::value_parser!(u64).range(0..=40)
    )]
    pub join_queue_wait_secs: u64,

    /// Joins one source address (an IPv6 one by its /64) may have in flight;
    /// more get 429 with Retry-After and the agent retries. Keep it at 8 or
    /// more: a NAT gateway puts a whole subnet's booting nodes behind one
    /// address. Behind a load balancer that does not keep client addresses
    /// (a Service without externalTrafficPolicy: Local, a proxy) every node
    /// seems to come from the balancer: set 0 (no per-source limit).
    #[arg(long, env = "AUTONODE_MAX_JOINS_PER_SOURCE", default_value = "8")]
    pub max_joins_per_source: u32,

    /// Open connections to the join API at once; more are closed on accept.
    #[arg(long, env = "AUTONODE_MAX_CONNECTIONS", default_value = "4096", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Open connections from one source address (an IPv6 one by its /64);
    /// more are closed on accept. Keep it at 64 or more: a NAT gateway puts
    /// a whole subnet's booting nodes behind one address (see
    /// --max-joins-per-source; 0: no per-source limit).
    #[arg(
        long,
        env = "AUTONODE_MAX_CONNECTIONS_PER_SOURCE",
        default_value = "64"
    )]
    pub max_connections_per_source: u32,

    /// TLS ClientHellos answered at once. The answer's signature is what a
    /// handshake costs the server (about 1 ms of CPU with an RSA 2048 key,
    /// cert-manager's default; far less with ECDSA), and a caller gets it
    /// for a replayed ClientHello that costs it nothing. It is made off
    /// the worker threads, on at most this many threads; more handshakes
    /// wait their turn, in order of arrival, within --handshake-timeout
    /// (then closed). So a flood of ClientHellos takes at most this many
    /// cores, and joins and the leader's work go on beside it.
    #[arg(long, env = "AUTONODE_MAX_HANDSHAKES", default_value = "2", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_handshakes: u32,

    /// TLS handshakes one source address (an IPv6 one by its /64) may have
    /// waiting for or making the answer to its ClientHello (see
    /// --max-handshakes); more are closed at once. So one source's flood
    /// waits behind itself, not in front of everyone else. Keep it at 32 or
    /// more (a NAT gateway puts a subnet's booting nodes behind one
    /// address); 0: no per-source limit (behind a load balancer that hides
    /// client addresses, as --max-joins-per-source).
    #[arg(long, env = "AUTONODE_MAX_HANDSHAKES_PER_SOURCE", default_value = "32")]
    pub max_handshakes_per_source: u32,

    /// Joins and reports one source address (an IPv6 one by its /64) may
    /// have refused (403) a second, after a burst of twice that. Past it,
    /// that source's new connections wait before their TLS handshake until
    /// its budget has one again (a wait longer than --handshake-timeout is
    /// closed at once). A refusal is the join API's dearest answer (a
    /// handshake and the document's signature), and an honest agent is
    /// refused once and stops: a source refused many times a second is
    /// sending documents in a loop. Honest machines behind the same
    /// address wait with it, for the debt the loop ran up (about a second
    /// for 16 looping callers at the default), and are not shut out. 0: no
    /// limit (behind a load balancer that hides client addresses, as
    /// --max-joins-per-source).
    #[arg(
        long,
        env = "AUTONODE_REFUSALS_PER_SOURCE",
        default_value = "16",
        value_parser = clap::value_parser!(u32).range(0..=100_000)
    )]
    pub refusals_per_source: u32,

    /// Seconds a connection has for its TLS handshake.
    #[arg(
        long = "handshake-timeout",
        env = "AUTONODE_HANDSHAKE_TIMEOUT",
        default_value = "3",
        value_name = "SECONDS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub handshake_timeout_secs: u64,

    /// Seconds a request has to send its headers, and again its body (a
    /// join request is a few KiB); a slow one is answered 408 and closed.
    #[arg(
        long = "body-timeout",
        env = "AUTONODE_BODY_TIMEOUT",
        default_value = "5",
        value_name = "SECONDS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub body_timeout_secs: u64,
}

impl JoinApiArgs {
    /// The join API's limits.
    pub fn limits(&self) -> autonode_server::front::api::Limits {
        let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        autonode_server::front::api::Limits {
            max_concurrent_joins: count(self.max_concurrent_joins),
            join_queue_wait: Duration::from_secs(self.join_queue_wait_secs),
            max_joins_per_source: count(self.max_joins_per_source),
            max_connections: count(self.max_connections),
            max_connections_per_source: count(self.max_connections_per_source),
            max_handshakes: count(self.max_handshakes),
            max_handshakes_per_source: count(self.max_handshakes_per_source),
            refusals_per_source: self.refusals_per_source,
            handshake_timeout: Duration::from_secs(self.handshake_timeout_secs),
            body_timeout: Duration::from_secs(self.body_timeout_secs),
            ..autonode_server::front::api::Limits::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::{Parser, Subcommand};
    use std::io::Write as _;
    use std::sync::{Arc, Mutex};

    /// The binary's command line, cut down to `serve`.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(Debug, Subcommand)]
    enum Sub {
        Serve(Box<ServeArgs>),
    }

    /// The flags `serve` cannot start without.
    const REQUIRED: &[&str] = &[
        "--tls-cert=/c.pem",
        "--tls-key=/k.pem",
        "--kubeconfig=/kc",
        "--allowed-accounts=111122223333",
        "--allowed-regions=us-west-2",
    ];

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn argv(extra: &[&str]) -> Vec<OsString> {
        os(&[&["autonode-server", "serve"], REQUIRED, extra].concat())
    }

    fn serve(extra: &[&str]) -> std::result::Result<ServeArgs, clap::Error> {
        let Sub::Serve(args) = Cli::try_parse_from(argv(extra))?.command;
        Ok(*args)
    }

    #[test]
    fn what_the_command_line_leaves_out_takes_its_default() {
        let args = serve(&[]).unwrap();
        assert_eq!(args.listen.to_string(), "0.0.0.0:8443");
        assert_eq!(args.metrics_listen.to_string(), "0.0.0.0:9090");
        assert_eq!(args.max_instance_age(), Duration::from_secs(900));
        assert_eq!(args.clock_skew(), Duration::from_secs(60));
        assert_eq!(args.cluster_dns, ["10.96.0.10"]);
        assert_eq!(args.cluster_domain, "cluster.local");
        assert_eq!(args.ignition_namespace, "autonode-system");
        assert!(args.ignition_secrets && args.delete_failed_nodeclaims);
        assert!(args.approve_kubelet_csrs && args.nodeclasses.manage_nodeclasses);
        assert!(args.nodeclasses.enforce_metadata_options);
        assert!(!args.nodeclasses.install_crds && !args.check_config);
        assert_eq!(args.nodeclasses.rollout_failures, 3);
        assert_eq!(args.pending_csr_cap, 5);
        assert_eq!(args.log_format, "text");
        assert_eq!(args.user_data.join_ca_form, JoinCaForm::Pin);
        assert!(!args.user_data.is_set());
        args.check().unwrap();
    }

    #[test]
    fn one_worker_thread_unless_told_and_never_none() {
        assert_eq!(serve(&[]).unwrap().worker_threads, 1);
        assert_eq!(serve(&["--worker-threads=4"]).unwrap().worker_threads, 4);
        for refused in ["--worker-threads=0", "--worker-threads=257"] {
            let err = serve(&[refused]).expect_err(refused);
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{refused}");
        }
    }

    #[test]
    fn ec2s_budget_is_half_the_accounts_default_unless_told_and_never_none() {
        assert_eq!(serve(&[]).unwrap().ec2_calls_per_second, 10);
        let raised = serve(&["--ec2-calls-per-second=40"]).unwrap();
        assert_eq!(raised.ec2_calls_per_second, 40);
        for refused in ["--ec2-calls-per-second=0", "--ec2-calls-per-second=1001"] {
            let err = serve(&[refused]).expect_err(refused);
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{refused}");
        }
    }

    #[test]
    fn the_join_apis_limits_default_to_the_documented_caps() {
        let limits = serve(&[]).unwrap().join_api.limits();
        assert_eq!(limits.max_concurrent_joins, 256);
        assert_eq!(limits.max_joins_per_source, 8);
        assert_eq!(limits.max_connections, 4096);
        assert_eq!(limits.max_connections_per_source, 64);
        assert_eq!(limits.max_handshakes, 2);
        assert_eq!(limits.max_handshakes_per_source, 32);
        assert_eq!(limits.refusals_per_source, 16);
        assert_eq!(limits.handshake_timeout, Duration::from_secs(3));
        assert_eq!(limits.body_timeout, Duration::from_secs(5));
    }

    #[test]
    fn values_are_read_as_given() {
        let args = serve(&[
            "--cluster-dns=10.0.0.1,10.0.0.2",
            "--max-instance-age=60",
            "--install-crds",
            "--ignition-secrets=false",
            "--base-ignition=configmap/base",
            "--join-certificate-lifetime=3600",
            "--max-joins-per-source=0",
        ])
        .unwrap();
        assert_eq!(
            args.cluster_dns,
            ["10.0.0.1", "10.0.0.2"],
            "comma-separated"
        );
        assert_eq!(args.max_instance_age(), Duration::from_secs(60));
        assert!(args.nodeclasses.install_crds, "alone, it means true");
        assert!(!args.ignition_secrets);
        assert_eq!(args.certificate_lifetimes().join, Duration::from_secs(3600));
        assert_eq!(args.join_api.limits().max_joins_per_source, 0);
        args.check().unwrap();
    }

    #[test]
    fn a_missing_required_setting_is_refused() {
        let e =
            Cli::try_parse_from(os(&["autonode-server", "serve", "--tls-cert=/c"])).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn values_out_of_their_range_are_refused() {
        for bad in [
            "--max-concurrent-joins=0",
            "--max-connections=0",
            "--max-handshakes=0",
            "--max-handshakes=257",
            "--refusals-per-source=100001",
            "--rollout-failures=0",
            "--rollout-ready-deadline=0",
            "--handshake-timeout=0",
            "--body-timeout=0",
            "--agent-deadline=0",
            "--agent-deadline=901",
            "--agent-deadline=ten",
            "--log-format=xml",
            "--listen=nowhere",
            "--base-ignition=pod/x",
            "--join-ca-form=der",
        ] {
            assert!(serve(&[bad]).is_err(), "{bad} was accepted");
        }
        assert_eq!(
            serve(&["--agent-deadline=900"])
                .unwrap()
                .user_data
                .agent_deadline_secs,
            Some(900)
        );
    }

    #[test]
    fn check_refuses_a_secret_base_config_with_secrets_off() {
        let args = serve(&["--base-ignition=secret/base", "--ignition-secrets=false"]).unwrap();
        let e = args.check().unwrap_err().to_string();
        assert!(e.contains("--ignition-secrets=false"), "{e}");
        let on = serve(&["--base-ignition=secret/base"]).unwrap();
        on.check().unwrap();
    }

    #[test]
    fn check_refuses_the_removed_nodeclass_selector_and_says_what_replaces_it() {
        let args = serve(&["--nodeclass-selector=team=a"]).unwrap();
        let e = args.check().unwrap_err().to_string();
        assert!(e.contains("was removed"), "{e}");
        assert!(e.contains("--nodeclass-names"), "{e}");
    }

    #[test]
    fn check_refuses_ami_ids_that_are_not_arch_equals_ami() {
        for bad in ["amd64", "amd64=ami-xyz", "amd64=ami-1,amd64=ami-2"] {
            let args = serve(&[&format!("--ami-ids={bad}")]).unwrap();
            let e = format!("{:#}", args.check().unwrap_err());
            assert!(e.starts_with("--ami-ids"), "{bad}: {e}");
        }
        let good = serve(&["--ami-ids=amd64=ami-0123,arm64=ami-0456"]).unwrap();
        good.check().unwrap();
    }

    /// A `--config` file holding `toml`, and the arguments naming it.
    fn with_file(toml: &str, extra: &[&str]) -> (tempfile::NamedTempFile, Vec<OsString>) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(toml.as_bytes()).unwrap();
        let mut args = argv(extra);
        args.push(format!("--config={}", file.path().display()).into());
        (file, args)
    }

    #[test]
    fn a_config_file_fills_in_flags_and_the_command_line_wins() {
        let toml = "cluster-dns = [\"10.0.0.10\", \"10.0.0.11\"]\n\
                    max-instance-age = 120\ninstall-crds = true\nclock-skew = 5\n";
        let (_file, args) = with_file(toml, &["--clock-skew=7"]);
        let expanded = expand_config_file::<Cli>(args).unwrap();
        assert_eq!(expanded[2], "--cluster-dns=10.0.0.10,10.0.0.11");
        let Sub::Serve(args) = Cli::try_parse_from(expanded).unwrap().command;
        assert_eq!(args.cluster_dns, ["10.0.0.10", "10.0.0.11"]);
        assert_eq!(args.max_instance_age(), Duration::from_secs(120));
        assert!(args.nodeclasses.install_crds);
        assert_eq!(args.clock_skew(), Duration::from_secs(7), "the flag wins");
    }

    #[test]
    fn a_config_file_with_an_unknown_key_or_value_is_refused_by_name() {
        for (toml, named) in [
            (
                "max-instance-ages = 1\n",
                "unknown setting `max-instance-ages`",
            ),
            ("config = \"/other.toml\"\n", "unknown setting `config`"),
            ("check-config = true\n", "unknown setting `check-config`"),
            (
                "clock-skew = 1.5\n",
                "setting `clock-skew`: unsupported value",
            ),
            ("listen = [\n", "parsing config file"),
        ] {
            let (_file, args) = with_file(toml, &[]);
            let e = format!("{:#}", expand_config_file::<Cli>(args).unwrap_err());
            assert!(e.contains(named), "{toml:?}: {e}");
        }
    }

    #[test]
    fn without_a_config_file_the_arguments_are_left_as_they_are() {
        let args = argv(&[]);
        assert_eq!(expand_config_file::<Cli>(args.clone()).unwrap(), args);
        let missing = argv(&["--config", "/nonexistent/autonode.toml"]);
        let e = format!("{:#}", expand_config_file::<Cli>(missing).unwrap_err());
        assert!(
            e.contains("reading config file /nonexistent/autonode.toml"),
            "{e}"
        );
    }

    #[test]
    fn a_flag_is_given_with_or_without_its_value_but_not_by_its_prefix() {
        let args = os(&["--listen=x", "--clock-skew", "3"]);
        assert!(given_as_flag(&args, "listen"));
        assert!(given_as_flag(&args, "clock-skew"));
        assert!(!given_as_flag(&args, "clock"));
        assert!(!given_as_flag(&args, "metrics-listen"));
    }

    #[test]
    fn userdata_settings_name_the_first_missing_flag() {
        let args = serve(&["--public-url=https://a.example:8443"]).unwrap();
        assert!(args.user_data.is_set());
        let e = args.user_data.settings().unwrap_err().to_string();
        assert_eq!(e, "--join-ca-file is required to render userData");
    }

    /// What `f` logs, as text.
    fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        let out = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        (out, text)
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_sealing_key_is_its_files_and_the_previous_keys_still_open() {
        use autonode_server::kube::seal::StateKey;
        let dir = tempfile::tempdir().unwrap();
        let put = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let tls = put("tls.key", b"-----BEGIN PRIVATE KEY-----\nthe serving key\n");
        let seal = put("seal.key", &[5; 32]);
        let before = StateKey::from_tls_key(&tls).unwrap();
        let sealed_before = before.mac(b"p", "u", "t");

        // As deployed before: derived from the TLS key, and warned.
        let (key, log) = logged(|| serve(&[]).unwrap().nodeclasses.state_key(&tls));
        assert_eq!(key.unwrap(), before);
        assert!(
            log.contains("WARN") && log.contains("--seal-key-file is unset"),
            "{log}"
        );

        // Upgraded: its own key, and the TLS key's seals still open.
        let flags = [
            format!("--seal-key-file={}", seal.display()),
            format!(
                "--previous-seal-key-file={},{}",
                tls.display(),
                dir.path().join("absent").display()
            ),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (key, log) = logged(|| serve(&flags).unwrap().nodeclasses.state_key(&tls));
        let key = key.unwrap();
        assert!(key.opens(b"p", "u", "t", &sealed_before));
        let own = StateKey::from_key_file(&seal).unwrap();
        assert_eq!(key.mac(b"p", "u", "t"), own.mac(b"p", "u", "t"));
        assert!(log.contains("no previous sealing key there"), "{log}");
        assert!(!log.contains("WARN"), "{log}");

        // The old name: the same key, and a deprecation warning.
        let old = format!("--rollout-state-key-file={}", seal.display());
        let (key, log) = logged(|| serve(&[&old]).unwrap().nodeclasses.state_key(&tls));
        assert_eq!(key.unwrap(), own);
        assert!(log.contains("WARN") && log.contains("deprecated"), "{log}");
        let both = format!("--seal-key-file={}", seal.display());
        assert!(serve(&[&old, &both]).is_err());
    }

    #[tokio::test]
    async fn upkeep_without_its_userdata_flags_is_off_and_says_so() {
        use autonode_server::kube::metrics::Metrics;
        let args = serve(&[]).unwrap();
        let metrics = Metrics::new();
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let clock = autonode_server::primitives::clock::Clock::SYSTEM;
        let events =
            autonode_server::kube::events::Events::new(client, "t".into(), &metrics, clock);
        let mut key = tempfile::NamedTempFile::new().unwrap();
        key.write_all(&[7; 32]).unwrap();
        let key = args.nodeclasses.state_key(key.path()).unwrap();
        let (settings, log) = logged(|| {
            args.nodeclasses
                .settings(&args.user_data, &metrics, &events, key, clock, "ns")
        });
        assert!(settings.unwrap().is_none());
        assert!(
            log.contains("WARN") && log.contains("EC2NodeClass upkeep is off"),
            "{log}"
        );
    }
}
