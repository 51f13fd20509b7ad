//! `autonode-server serve`: wires the join API, the caches and the
//! observability endpoints together and runs until SIGTERM.

use crate::cmd::config::{self, ServeArgs};
use anyhow::{Context, Result};
use autonode_server::attestation::policy::{Policy as AttestationPolicy, PolicyFile};
use autonode_server::attestation::{watch_policy, Attestation};
use autonode_server::controllers::watches::Leader;
use autonode_server::ec2::{Batched, Ec2Client, Ec2Settings, InstanceLookup};
use autonode_server::front::api::{self, Api};
use autonode_server::front::probes;
use autonode_server::front::tls::ReloadingCert;
use autonode_server::join::render::inputs::{NodeConfig, NodeConfigSettings};
use autonode_server::join::render::ClusterSettings;
use autonode_server::join::{ClusterInfo, JoinContext};
use autonode_server::kube::budget::{self, Budget};
use autonode_server::kube::events::Events;
use autonode_server::kube::in_flight::InFlightLayer;
use autonode_server::kube::issuer::Issuer;
use autonode_server::kube::metrics::Metrics;
use autonode_server::kube::nodeclaim::NodeClaims;
use autonode_server::kube::seal::StateKey;
use autonode_server::primitives::clock::Clock;
use autonode_server::primitives::limiter::refusal_line_limiter;
use autonode_server::report::{Replays, ReportContext};
use autonode_server::{controllers::approver, controllers::leader};
use autonode_shared::identity::{Policy, TrustStore};
use autonode_shared::nitro::Root as NitroRoot;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Checks what needs no cluster, then starts the caches, the leader's
/// controllers and the endpoints, and serves until SIGTERM.
pub async fn run(args: ServeArgs) -> Result<()> {
    // Settings that are wrong on their own fail before the cluster is
    // touched: no CRDs installed, no watches or election started.
    args.check()?;
    let trust = trust_store(&args)?;
    let policy = policy(&args)?;
    let (client, config, cluster) = guest_cluster(&args).await?;
    if args.nodeclasses.install_crds {
        autonode_server::controllers::crds::install(&client)
            .await
            .context("installing the Karpenter CRDs")?;
    }
    // The one place the real clock is chosen: every part that reads "now"
    // is handed this one.
    let clock = Clock::SYSTEM;
    let metrics = Metrics::new();
    let events = Events::new(client.clone(), args.instance_name.clone(), &metrics, clock);
    // The one sealing key: the rollout guard's state and NodeClaim marks.
    let key = args.nodeclasses.state_key(&args.tls_key)?;
    let signing = args.certificate_lifetimes().signing;
    let settings = budget::Settings {
        delete: args.delete_failed_nodeclaims,
        limit: args.failure_budget,
    };
    let told = (events.clone(), metrics.clone());
    let budget = Budget::new(client.clone(), settings, told, clock);
    let claims = NodeClaims::start(client.clone(), key, (clock, signing), budget);
    let issuer = Issuer::start(client.clone(), args.csr_timeout());
    let ec2 = ec2_lookup(&args).await?;
    let leader = leader(
        &args,
        &client,
        (&claims, key),
        &ec2,
        &metrics,
        &events,
        clock,
    )?;
    // The approver, the feedback and the EC2NodeClass upkeep, on the
    // watches they share (see `watches`).
    let leading = start_election(&args, config, &metrics, clock)?;
    tokio::spawn(leader::while_leading(
        leading,
        "leader-controllers",
        move || leader.clone().run(),
    ));
    let nodeconfig = NodeConfig::start(
        client,
        NodeConfigSettings {
            namespace: args.ignition_namespace.clone(),
            base_ignition: args.base_ignition.clone(),
            secrets: args.ignition_secrets,
        },
        events.clone(),
    );
    let attestation = attestation(&args, key)?;
    let join = Arc::new(JoinContext {
        trust: trust.clone(),
        policy: policy.clone(),
        claims: claims.clone(),
        ec2,
        issuer,
        cluster,
        events: events.clone(),
        metrics: metrics.clone(),
        nodeconfig: nodeconfig.clone(),
        clock,
        lifetimes: args.certificate_lifetimes(),
        lookups: autonode_server::join::lookup_limiter(),
        min_agent_version: args.min_agent_version,
        attestation,
        refusal_lines: refusal_line_limiter(),
    });
    let report = Arc::new(ReportContext {
        trust,
        policy,
        claims: claims.clone(),
        events,
        metrics: metrics.clone(),
        clock,
        replays: Replays::default(),
        unbound_reads: autonode_server::report::unbound_read_limiter(),
        refusal_lines: refusal_line_limiter(),
    });
    let readiness = probes::Readiness { claims, nodeconfig };
    serve(&args, join, report, readiness, metrics).await
}

/// Attested joins: the Nitro root, the operator's policy (read now, and
/// watched for changes), nonces under the replicas' sealing key.
fn attestation(args: &ServeArgs, key: StateKey) -> Result<Arc<Attestation>> {
    let root = match &args.nitro_root {
        Some(path) => {
            let pem = std::fs::read(path)
                .with_context(|| format!("reading --nitro-root {}", path.display()))?;
            NitroRoot::from_pem(&pem).with_context(|| format!("--nitro-root {}", path.display()))?
        }
        None => NitroRoot::aws(),
    };
    let Some(path) = &args.attestation_policy else {
        return Ok(Arc::new(Attestation::new(
            key,
            root,
            AttestationPolicy::default(),
        )));
    };
    let (file, policy) = PolicyFile::load(path)?;
    tracing::info!(
        file = %path.display(),
        classes = policy.classes(),
        "attestation policy read: the classes it names must attest with NitroTPM"
    );
    let attestation = Arc::new(Attestation::new(key, root, policy));
    tokio::spawn(watch_policy(attestation.clone(), file));
    Ok(attestation)
}

/// EC2, as the join and the approver look instances up: the lookups that
/// wait together asked in one call, within `--ec2-calls-per-second`
/// (`ec2::Batched`).
async fn ec2_lookup(args: &ServeArgs) -> Result<Arc<dyn InstanceLookup>> {
    let ec2 = Ec2Client::new(Ec2Settings {
        endpoint: args.ec2_endpoint.clone(),
        ..Ec2Settings::default()
    })
    .await
    .context("setting up the EC2 client")?;
    Ok(Arc::new(Batched::new(
        Arc::new(ec2),
        args.ec2_calls_per_second,
    )))
}

/// What the leader runs, from the settings.
fn leader(
    args: &ServeArgs,
    client: &kube::Client,
    (claims, key): (&NodeClaims, StateKey),
    ec2: &Arc<dyn InstanceLookup>,
    metrics: &Metrics,
    events: &Events,
    clock: Clock,
) -> Result<Leader> {
    Ok(Leader {
        client: client.clone(),
        claims: claims.clone(),
        events: events.clone(),
        metrics: metrics.clone(),
        approver: args.approve_kubelet_csrs.then(|| approver::Settings {
            claims: claims.clone(),
            events: events.clone(),
            ec2: ec2.clone(),
            metrics: metrics.clone(),
            pending_cap: args.pending_csr_cap,
            signing_duration: args.certificate_lifetimes().signing,
            clock,
        }),
        nodeclasses: args.nodeclasses.settings(
            &args.user_data,
            metrics,
            events,
            key,
            clock,
            &args.leader_namespace,
        )?,
        capacity: args.capacity_tolerance(),
        clock,
    })
}

/// Binds the join API and the probes, and serves until SIGTERM.
async fn serve(
    args: &ServeArgs,
    join: Arc<JoinContext>,
    report: Arc<ReportContext>,
    readiness: probes::Readiness,
    metrics: Metrics,
) -> Result<()> {
    let limits = args.join_api.limits();
    let cert = ReloadingCert::load(&args.tls_cert, &args.tls_key)
        .context("loading the serving certificate")?;
    cert.spawn_reloader();
    let tls = Arc::new(cert.server_config());
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let metrics_listener = std::net::TcpListener::bind(args.metrics_listen)
        .with_context(|| format!("listening on {}", args.metrics_listen))?;
    tracing::info!(join_api = %listener.local_addr()?, metrics = %metrics_listener.local_addr()?, "autonode-server serving");
    probes::start(metrics_listener, metrics.clone(), readiness)
        .context("starting the probes' thread")?;
    tokio::select! {
        _ = api::serve(listener, tls, Api::new(join, report, limits, metrics)) => {}
        _ = shutdown_signal() => tracing::info!("shutting down"),
    }
    Ok(())
}

/// Starts leader election on its own thread, with its own client made
/// from `config`; the receiver says whether this replica leads.
fn start_election(
    args: &ServeArgs,
    config: kube::Config,
    metrics: &Metrics,
    clock: Clock,
) -> Result<watch::Receiver<bool>> {
    let lease = std::time::Duration::from_secs(args.leader_lease_secs.max(3));
    let election = leader::Election {
        namespace: args.leader_namespace.clone(),
        name: "autonode-server".into(),
        // Unique per process even where replicas share a name.
        identity: format!("{}_{:08x}", args.instance_name, rand::random::<u32>()),
        lease_duration: lease,
        renew_every: lease / 3,
        // client-go's proportions (10 s of a 15 s Lease): a third of the
        // Lease for the leader to have stopped before anyone may take it.
        renew_deadline: lease * 2 / 3,
        clock,
    };
    election
        .start(config, metrics.leader.clone())
        .context("starting leader election")
}

/// A client for the guest cluster, its settings (for the election's own
/// client), and how nodes are to reach it.
async fn guest_cluster(args: &ServeArgs) -> Result<(kube::Client, kube::Config, ClusterInfo)> {
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("loading the guest cluster kubeconfig")?;
    let api_server = match &args.api_server_url {
        Some(url) => url.clone(),
        None => config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string(),
    };
    let ca_pem = match &args.cluster_ca_file {
        Some(path) => config::read(path)?,
        None => kubeconfig_ca(&config)
            .context("the kubeconfig has no CA data; pass --cluster-ca-file")?,
    };
    let in_flight = InFlightLayer::new(args.kube_api_in_flight.into());
    let client = kube::client::ClientBuilder::try_from(config.clone())
        .context("building the guest cluster client")?
        .with_layer(&in_flight)
        .build();
    let settings = ClusterSettings {
        cluster_dns: args.cluster_dns.clone(),
        cluster_domain: args.cluster_domain.clone(),
    };
    Ok((
        client,
        config,
        ClusterInfo {
            api_server,
            ca_pem,
            settings,
        },
    ))
}

fn kubeconfig_ca(config: &kube::Config) -> Option<String> {
    let pem = autonode_shared::pem::bundle(config.root_cert.as_ref()?);
    (!pem.is_empty()).then_some(pem)
}

fn trust_store(args: &ServeArgs) -> Result<TrustStore> {
    let mut trust = TrustStore::aws();
    if let Some(dir) = &args.identity_certs {
        let added = trust
            .load_dir(dir)
            .with_context(|| format!("loading identity certificates from {}", dir.display()))?;
        tracing::info!(dir = %dir.display(), added, "extra identity certificates pinned");
    }
    Ok(trust)
}

fn policy(args: &ServeArgs) -> Result<Policy> {
    let mut policy = Policy::new(
        args.allowed_accounts
            .iter()
            .filter(|a| !a.is_empty())
            .cloned(),
        args.allowed_regions
            .iter()
            .filter(|r| !r.is_empty())
            .cloned(),
    );
    policy.max_age =
        time::Duration::try_from(args.max_instance_age()).context("max instance age")?;
    policy.clock_skew = time::Duration::try_from(args.clock_skew()).context("clock skew")?;
    Ok(policy)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
