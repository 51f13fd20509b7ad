//! The agent binary behind an egress proxy: the server connection (join
//! and reports) tunnels through HTTP CONNECT, IMDS never does, NO_PROXY
//! and the config choose the route, and a bad proxy URL is a config error.

use anyhow::Result;
use autonode_tests::machines::barenode::{BareNode, ImdsAt};
use autonode_tests::machines::node::{agent_binary, launch_machine, IMDS_ENDPOINT_ENV};
use autonode_tests::network::proxy::{ConnectProxy, Seen, PROXY_ENV};
use autonode_tests::server::world::World;
use base64::Engine as _;
use std::net::SocketAddr;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

const CREDENTIALS: (&str, &str) = ("agent", "s3cret-pass");

fn basic((user, password): (&str, &str)) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A bare node whose "server", inside the namespace, only counts the
/// connections that reach it directly and closes them: every join attempt
/// fails, and the short deadline ends each run with exit code 3.
struct Scene {
    node: BareNode,
    server: SocketAddr,
    direct: Arc<AtomicUsize>,
    _counter: JoinHandle<()>,
}

impl Scene {
    async fn new() -> Result<Self> {
        // No userData: the local config names the server, whose address
        // is known only once the namespace exists.
        let node = BareNode::boot("", ImdsAt::V4)?;
        let listener = node.netns.listen(loopback())?;
        let server = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let direct = Arc::new(AtomicUsize::new(0));
        let count = direct.clone();
        let counter = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Ok(Self {
            node,
            server,
            direct,
            _counter: counter,
        })
    }

    /// The local config: this scene's server, a 3-second deadline, and
    /// `options` (more `[options]` keys).
    fn configure(&self, options: &str) -> Result<()> {
        self.node.write_local_config(&format!(
            "server-url = \"https://{}\"\nserver-ca-sha256 = \"{}\"\ncluster-name = \"test\"\n\
             [options]\ndeadline = \"3s\"\n{options}",
            self.server,
            "ab".repeat(32)
        ))
    }

    /// A proxy inside the namespace, dialling out from the test's.
    fn proxy(&self, credentials: Option<(&str, &str)>) -> Result<ConnectProxy> {
        ConnectProxy::start(self.node.netns.listen(loopback())?, credentials)
    }

    fn direct(&self) -> usize {
        self.direct.load(Ordering::SeqCst)
    }
}

fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_connection_goes_through_the_proxy_and_imds_never_does() -> Result<()> {
    let scene = Scene::new().await?;
    scene.configure("")?;
    let proxy = scene.proxy(Some(CREDENTIALS))?;
    let url = proxy.url(Some(CREDENTIALS));
    let run = scene.node.run_agent(&[("HTTPS_PROXY", &url)], &[]).await?;
    let stderr = text(&run);
    assert_eq!(run.status.code(), Some(3), "{stderr}");

    let seen = proxy.seen();
    assert!(!seen.is_empty(), "the proxy saw nothing:\n{stderr}");
    let expected = basic(CREDENTIALS);
    for Seen {
        method,
        target,
        authorization,
        status,
    } in &seen
    {
        // Only the server, and never IMDS, though nothing excepts it.
        assert_eq!(
            (method.as_str(), target.as_str()),
            ("CONNECT", scene.server.to_string().as_str())
        );
        assert_eq!(authorization.as_ref(), Some(&expected));
        assert_ne!(*status, 407, "credentials refused");
    }
    assert_eq!(scene.direct(), 0, "the server was reached around the proxy");
    assert!(scene.node.imds.tokens_issued() >= 1, "IMDS not reached");

    let said = format!(
        "through the HTTP proxy {} (from environment variable HTTPS_PROXY), with its credentials",
        proxy.addr()
    );
    assert!(stderr.contains(&said), "{stderr}");
    let console = scene.node.console();
    for place in [&stderr, &console] {
        assert!(
            !place.contains(CREDENTIALS.1),
            "credentials leaked:\n{place}"
        );
        assert!(
            !place.contains(&expected[6..]),
            "credentials leaked:\n{place}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_proxy_and_the_config_choose_the_route() -> Result<()> {
    let scene = Scene::new().await?;
    let from_env = scene.proxy(None)?;
    let env_url = from_env.url(None);

    // NO_PROXY excepts the server (by CIDR): it is reached directly.
    scene.configure("")?;
    let no_proxy = [
        ("HTTPS_PROXY", env_url.as_str()),
        ("NO_PROXY", "join.example, 127.0.0.0/8"),
    ];
    let run = scene.node.run_agent(&no_proxy, &[]).await?;
    let stderr = text(&run);
    assert_eq!(run.status.code(), Some(3), "{stderr}");
    assert!(scene.direct() >= 1, "not reached directly:\n{stderr}");
    assert_eq!(from_env.seen(), vec![], "NO_PROXY ignored");
    assert!(
        stderr.contains("direct: the server's host matches environment variable NO_PROXY"),
        "{stderr}"
    );

    // The config's proxy wins over the environment's.
    let from_config = scene.proxy(None)?;
    let direct_before = scene.direct();
    scene.configure(&format!("https-proxy = \"{}\"\n", from_config.url(None)))?;
    let run = scene
        .node
        .run_agent(&[("HTTPS_PROXY", &env_url)], &[])
        .await?;
    let stderr = text(&run);
    assert_eq!(run.status.code(), Some(3), "{stderr}");
    assert!(
        !from_config.seen().is_empty(),
        "config proxy unused:\n{stderr}"
    );
    assert_eq!(from_env.seen(), vec![], "the environment's proxy was used");
    assert_eq!(scene.direct(), direct_before);
    assert!(
        stderr.contains("(from [options] https-proxy in the agent config)"),
        "{stderr}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_proxy_url_is_a_config_error_naming_its_source() -> Result<()> {
    let scene = Scene::new().await?;
    scene.configure("")?;
    let started = Instant::now();
    let bad = [("https_proxy", "socks5://agent:s3cret-pass@proxy:1080")];
    let run = scene.node.run_agent(&bad, &[]).await?;
    let stderr = text(&run);
    assert_eq!(run.status.code(), Some(4), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "waited for the deadline"
    );
    assert!(
        stderr.contains("environment variable https_proxy"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
    assert_eq!(scene.direct(), 0);

    scene.configure("https-proxy = \"http://proxy:3128/some/path\"\n")?;
    let run = scene.node.run_agent(&[], &[]).await?;
    let stderr = text(&run);
    assert_eq!(run.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("[options] https-proxy"), "{stderr}");
    Ok(())
}

/// End to end: the real server behind an authenticating proxy. TLS runs
/// through the tunnel with the server's CA verified as usual, the join
/// completes, and the progress report takes the same way.
#[tokio::test]
async fn the_agent_joins_through_an_authenticating_proxy() -> Result<()> {
    let world = World::start().await?;
    let (claim, node) = launch_machine(&world).await?;
    let proxy = ConnectProxy::start(node.netns.listen(loopback())?, Some(CREDENTIALS))?;
    let mut command = node.netns.command(agent_binary()?);
    command
        .args(node.agent_args())
        .env_remove(IMDS_ENDPOINT_ENV);
    for name in PROXY_ENV {
        command.env_remove(name);
    }
    command.env("HTTPS_PROXY", proxy.url(Some(CREDENTIALS)));
    let run = command.output().await?;
    let stderr = text(&run);
    assert_eq!(run.status.code(), Some(0), "agent failed:\n{stderr}");
    assert!(node.systemctl_calls().contains("kubelet.service"));

    let server = world
        .server
        .url()
        .trim_start_matches("https://")
        .to_string();
    let seen = proxy.seen();
    // The join, then the "kubelet started" report.
    assert!(seen.len() >= 2, "{seen:?}");
    for one in &seen {
        assert_eq!(
            (one.target.as_str(), one.status),
            (server.as_str(), 200),
            "{one:?}"
        );
        assert_eq!(one.authorization, Some(basic(CREDENTIALS)));
    }
    let reasons = world.event_reasons(&claim, "AgentProgress").await?;
    assert!(
        reasons.contains(&"AgentProgress".to_string()),
        "{reasons:?}"
    );
    assert!(!stderr.contains(CREDENTIALS.1), "{stderr}");
    Ok(())
}
