//! A fake IMDSv2 for one instance (IMDS is per instance).
//!
//! Behaves as AWS's does with `HttpTokens: required`:
//! - `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds`
//!   in 1..=21600 returns a token (and echoes the TTL header); a missing or
//!   out-of-range TTL is 400, and a PUT carrying `X-Forwarded-For` is 403
//!   (IMDS refuses tokens to anything that looks proxied).
//! - Every GET without a valid, unexpired `X-aws-ec2-metadata-token` is 401,
//!   before anything else is looked at; then 404 for paths it does not hold.
//! - Other methods are 405.
//! - Directories list their entries one per line, sub-directories with a
//!   trailing `/`, no final newline.
//!
//! `/latest/dynamic/instance-identity/` serves `document` and `rsa2048`
//! only: `pkcs7` (DSA-signed) and `signature` are forms the server refuses,
//! so they answer 404 here rather than something unlike AWS's.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use time::OffsetDateTime;

use super::http::{respond, BoundSocket, Faults, Server, Service};
use super::{Instance, SignerError, TestCa};

/// Where an instance finds IMDS.
pub const IMDS_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)), 80);

const TOKEN_HEADER: &str = "x-aws-ec2-metadata-token";
const TTL_HEADER: &str = "x-aws-ec2-metadata-token-ttl-seconds";
const MAX_TTL_SECONDS: u64 = 21600;

#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    #[error("signing the identity document: {0}")]
    Sign(#[from] SignerError),
    #[error("starting the server: {0}")]
    Io(#[from] std::io::Error),
}

/// A running fake IMDS; stops on drop.
#[derive(Debug)]
pub struct Imds {
    server: Server,
    faults: Faults,
    tokens: Tokens,
    document: String,
    rsa2048: String,
}

impl Imds {
    /// Serves `instance` on 127.0.0.1 (an ephemeral port), at once.
    pub fn start(instance: &Instance, ca: &TestCa) -> Result<Self, ImdsError> {
        Self::start_on(BoundSocket::loopback()?, instance, ca, None)
    }

    /// Serves `instance` on `socket` (for instance 169.254.169.254:80 bound
    /// inside a network namespace). With `listen_after`, connections are
    /// refused until that much time has passed: IMDS not up yet at boot.
    pub fn start_on(
        socket: BoundSocket,
        instance: &Instance,
        ca: &TestCa,
        listen_after: Option<Duration>,
    ) -> Result<Self, ImdsError> {
        let document = instance.identity_document();
        // AWS signs a few seconds after the instance goes pending; signing
        // now keeps signingTime after pendingTime and never in the future.
        let rsa2048 = ca.rsa2048(document.as_bytes(), OffsetDateTime::now_utc())?;
        let tokens = Tokens::default();
        let faults = Faults::default();
        let service = Arc::new(ImdsService {
            tree: metadata_tree(instance, &document, &rsa2048),
            tokens: tokens.clone(),
        });
        let server = Server::start(socket, listen_after, faults.clone(), service)?;
        Ok(Self {
            server,
            faults,
            tokens,
            document,
            rsa2048,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://<addr>`, the base URL to give the agent.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Makes every token issued so far invalid (as if they had expired).
    pub fn invalidate_tokens(&self) {
        self.tokens.lock().clear();
    }

    /// How many tokens this IMDS has issued: proof that a client reached
    /// this fake and not some other 169.254.169.254.
    pub fn tokens_issued(&self) -> u64 {
        self.tokens.1.load(Ordering::Relaxed)
    }

    /// The identity document served (the exact signed bytes).
    pub fn document(&self) -> &str {
        &self.document
    }

    /// The `rsa2048` signature served.
    pub fn rsa2048(&self) -> &str {
        &self.rsa2048
    }
}

/// Issued tokens and when each expires, and how many were ever issued.
#[derive(Clone, Debug, Default)]
struct Tokens(Arc<Mutex<HashMap<String, Instant>>>, Arc<AtomicU64>);

impl Tokens {
    fn issue(&self, ttl: Duration) -> String {
        self.1.fetch_add(1, Ordering::Relaxed);
        // 56 base64 characters, the length of AWS's tokens.
        let mut raw = [0u8; 42];
        rand::Rng::fill(&mut rand::thread_rng(), &mut raw[..]);
        let token = base64::engine::general_purpose::STANDARD.encode(raw);
        let mut tokens = self.lock();
        let now = Instant::now();
        tokens.retain(|_, expiry| *expiry > now);
        tokens.insert(token.clone(), now + ttl);
        token
    }

    fn is_valid(&self, token: &str) -> bool {
        self.lock()
            .get(token)
            .is_some_and(|expiry| *expiry > Instant::now())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The paths IMDS serves: files and directories.
#[derive(Debug)]
enum Node {
    File(Bytes),
    Dir(BTreeMap<String, Node>),
}

impl Node {
    fn dir<const N: usize>(entries: [(&str, Node); N]) -> Self {
        Self::Dir(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    }

    fn file(content: impl Into<String>) -> Self {
        Self::File(Bytes::from(content.into()))
    }

    /// The node at `path` (`/`-separated, leading and trailing `/` ignored).
    fn find(&self, path: &str) -> Option<&Node> {
        path.split('/')
            .filter(|part| !part.is_empty())
            .try_fold(self, |node, part| match node {
                Node::Dir(entries) => entries.get(part),
                Node::File(_) => None,
            })
    }

    /// What a GET of this node returns. AWS marks sub-directories with a
    /// trailing `/`, except in the listings of `/` and `/latest/`.
    fn content(&self, mark_dirs: bool) -> Bytes {
        match self {
            Node::File(content) => content.clone(),
            Node::Dir(entries) => {
                let names: Vec<String> = entries
                    .iter()
                    .map(|(name, node)| match node {
                        Node::Dir(_) if mark_dirs => format!("{name}/"),
                        Node::Dir(_) => name.clone(),
                        Node::File(_) => name.clone(),
                    })
                    .collect();
                Bytes::from(names.join("\n"))
            }
        }
    }
}

fn metadata_tree(instance: &Instance, document: &str, rsa2048: &str) -> Node {
    let mut latest = BTreeMap::from([
        ("meta-data".to_string(), meta_data(instance)),
        (
            "dynamic".to_string(),
            Node::dir([(
                "instance-identity",
                Node::dir([
                    ("document", Node::file(document)),
                    ("rsa2048", Node::file(rsa2048)),
                ]),
            )]),
        ),
    ]);
    // No user data: AWS answers 404 and leaves it out of the listing.
    if !instance.user_data.is_empty() {
        let user_data = Node::File(Bytes::from(instance.user_data.clone()));
        latest.insert("user-data".to_string(), user_data);
    }
    Node::dir([("latest", Node::Dir(latest))])
}

/// `meta-data/`, with `ipv6` (the instance's first IPv6) only where it has
/// one, as IMDS serves it.
fn meta_data(i: &Instance) -> Node {
    let mut node = base_meta_data(i);
    if let (Node::Dir(entries), Some(ipv6)) = (&mut node, i.ipv6s.first()) {
        entries.insert("ipv6".into(), Node::file(ipv6.to_string()));
    }
    node
}

/// Every private IPv4 of the primary interface, its primary first, one a
/// line, as IMDS's `local-ipv4s`.
fn local_ipv4s(i: &Instance) -> String {
    let all = std::iter::once(&i.private_ip).chain(&i.secondary_ips);
    let lines: Vec<String> = all.map(ToString::to_string).collect();
    lines.join("\n")
}

fn base_meta_data(i: &Instance) -> Node {
    let ip = i.private_ip.to_string();
    Node::dir([
        ("ami-id", Node::file(&i.image_id)),
        ("ami-launch-index", Node::file("0")),
        ("ami-manifest-path", Node::file("(unknown)")),
        (
            "block-device-mapping",
            Node::dir([
                ("ami", Node::file("/dev/xvda")),
                ("root", Node::file("/dev/xvda")),
            ]),
        ),
        ("hostname", Node::file(&i.private_dns_name)),
        ("instance-action", Node::file("none")),
        ("instance-id", Node::file(&i.instance_id)),
        ("instance-life-cycle", Node::file("on-demand")),
        ("instance-type", Node::file(&i.instance_type)),
        ("local-hostname", Node::file(&i.local_hostname)),
        ("local-ipv4", Node::file(&ip)),
        ("mac", Node::file(&i.mac)),
        (
            "network",
            Node::dir([("interfaces", Node::dir([("macs", Node::Dir(mac_dir(i)))]))]),
        ),
        (
            "placement",
            Node::dir([
                ("availability-zone", Node::file(&i.availability_zone)),
                ("region", Node::file(&i.region)),
            ]),
        ),
        ("profile", Node::file("default-hvm")),
        ("reservation-id", Node::file(&i.reservation_id)),
        ("security-groups", Node::file("default")),
        (
            "services",
            Node::dir([
                ("domain", Node::file("amazonaws.com")),
                ("partition", Node::file("aws")),
            ]),
        ),
    ])
}

/// `network/interfaces/macs/<mac>/...` for the primary interface.
fn mac_dir(i: &Instance) -> BTreeMap<String, Node> {
    let [a, b, c, _] = i.private_ip.octets();
    let interface = Node::dir([
        ("device-number", Node::file("0")),
        ("interface-id", Node::file(&i.network_interface_id)),
        ("local-hostname", Node::file(&i.local_hostname)),
        ("local-ipv4s", Node::file(local_ipv4s(i))),
        ("mac", Node::file(&i.mac)),
        ("owner-id", Node::file(&i.account_id)),
        ("security-group-ids", Node::file("sg-0123456789abcdef0")),
        ("security-groups", Node::file("default")),
        ("subnet-id", Node::file(&i.subnet_id)),
        (
            "subnet-ipv4-cidr-block",
            Node::file(format!("{a}.{b}.{c}.0/24")),
        ),
        ("vpc-id", Node::file(&i.vpc_id)),
        ("vpc-ipv4-cidr-block", Node::file(format!("{a}.{b}.0.0/16"))),
        (
            "vpc-ipv4-cidr-blocks",
            Node::file(format!("{a}.{b}.0.0/16")),
        ),
    ]);
    let mut interface = interface;
    if let (Node::Dir(entries), false) = (&mut interface, i.ipv6s.is_empty()) {
        let lines: Vec<String> = i.ipv6s.iter().map(ToString::to_string).collect();
        entries.insert("ipv6s".into(), Node::file(lines.join("\n")));
    }
    BTreeMap::from([(i.mac.clone(), interface)])
}

struct ImdsService {
    tree: Node,
    tokens: Tokens,
}

impl Service for ImdsService {
    fn handle(&self, request: Request<Bytes>) -> Response<Full<Bytes>> {
        let path = request.uri().path();
        match *request.method() {
            Method::PUT if path == "/latest/api/token" => self.issue_token(&request),
            Method::GET if path == "/latest/api/token" => error(StatusCode::METHOD_NOT_ALLOWED),
            Method::GET => self.get(&request),
            _ => error(StatusCode::METHOD_NOT_ALLOWED),
        }
    }

    fn fault(&self, status: StatusCode) -> Response<Full<Bytes>> {
        error(status)
    }
}

impl ImdsService {
    fn issue_token(&self, request: &Request<Bytes>) -> Response<Full<Bytes>> {
        if request.headers().contains_key("x-forwarded-for") {
            return error(StatusCode::FORBIDDEN);
        }
        let ttl = request
            .headers()
            .get(TTL_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ttl| (1..=MAX_TTL_SECONDS).contains(ttl));
        let Some(ttl) = ttl else {
            return error(StatusCode::BAD_REQUEST);
        };
        let token = self.tokens.issue(Duration::from_secs(ttl));
        let ttl = ttl.to_string();
        respond(
            StatusCode::OK,
            &[TEXT_PLAIN, SERVER, (TTL_HEADER, &ttl)],
            token,
        )
    }

    fn get(&self, request: &Request<Bytes>) -> Response<Full<Bytes>> {
        let authorised = request
            .headers()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|token| self.tokens.is_valid(token));
        if !authorised {
            return error(StatusCode::UNAUTHORIZED);
        }
        let path = request.uri().path();
        let depth = path.split('/').filter(|part| !part.is_empty()).count();
        match self.tree.find(path) {
            Some(node) => respond(
                StatusCode::OK,
                &[TEXT_PLAIN, SERVER],
                node.content(depth > 1),
            ),
            None => error(StatusCode::NOT_FOUND),
        }
    }
}

const TEXT_PLAIN: (&str, &str) = ("content-type", "text/plain");
const SERVER: (&str, &str) = ("server", "EC2ws");

/// IMDS's error page, the same XHTML for every status.
fn error(status: StatusCode) -> Response<Full<Bytes>> {
    let title = format!(
        "{} - {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error")
    );
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"iso-8859-1\"?>\n\
         <!DOCTYPE html PUBLIC \"-//W3C//DTD XHTML 1.0 Transitional//EN\"\n\
         \t\"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd\">\n\
         <html xmlns=\"http://www.w3.org/1999/xhtml\" xml:lang=\"en\" lang=\"en\">\n \
         <head>\n  <title>{title}</title>\n </head>\n <body>\n  <h1>{title}</h1>\n </body>\n</html>\n"
    );
    respond(status, &[("content-type", "text/html"), SERVER], body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::fakecloud::http::testing::{send, Answer};
    use crate::cloud::fakecloud::signer::tests::shared_ca;

    fn instance() -> Instance {
        Instance::builder()
            .private_ip(Ipv4Addr::new(10, 0, 1, 23))
            .user_data("#cloud-config: none, this is the agent's config")
            .build()
    }

    async fn token(imds: &Imds, ttl: &str) -> Answer {
        let url = format!("{}/latest/api/token", imds.url());
        send(
            "PUT",
            &url,
            &[("X-aws-ec2-metadata-token-ttl-seconds", ttl)],
            "",
        )
        .await
        .expect("PUT token")
    }

    async fn get(imds: &Imds, path: &str, token: Option<&str>) -> Answer {
        let headers: Vec<(&str, &str)> = token
            .map(|t| vec![("X-aws-ec2-metadata-token", t)])
            .unwrap_or_default();
        send("GET", &format!("{}{path}", imds.url()), &headers, "")
            .await
            .expect("GET")
    }

    /// What real IMDS serves for an instance with more than one address:
    /// every private IPv4 of the primary interface in `local-ipv4s`, its
    /// primary first; every IPv6 in `ipv6s`; the first IPv6 as `ipv6`. (A
    /// second interface's addresses are under its own MAC, not served here.)
    #[tokio::test]
    async fn a_multi_address_instance_lists_every_address_of_its_primary_interface() {
        let mut instance = instance();
        instance.secondary_ips = vec![Ipv4Addr::new(10, 0, 1, 24), Ipv4Addr::new(10, 0, 1, 25)];
        instance.second_interface_ips = vec![Ipv4Addr::new(10, 0, 2, 9)];
        instance.ipv6s = vec![
            "2600:1f14::17".parse().unwrap(),
            "2600:1f14::18".parse().unwrap(),
        ];
        let imds = Imds::start(&instance, &shared_ca()).expect("start");
        let t = token(&imds, "60").await.body;
        let mac = &instance.mac;
        let read = |path: String| {
            let (imds, t) = (&imds, t.clone());
            async move { get(imds, &path, Some(&t)).await.body }
        };
        let base = format!("/latest/meta-data/network/interfaces/macs/{mac}");
        assert_eq!(
            read(format!("{base}/local-ipv4s")).await,
            "10.0.1.23\n10.0.1.24\n10.0.1.25"
        );
        assert_eq!(
            read(format!("{base}/ipv6s")).await,
            "2600:1f14::17\n2600:1f14::18"
        );
        assert_eq!(read("/latest/meta-data/ipv6".into()).await, "2600:1f14::17");
        assert_eq!(
            read("/latest/meta-data/local-ipv4".into()).await,
            "10.0.1.23"
        );
        // An instance without IPv6 has neither file, as on EC2.
        let plain = Imds::start(&super::tests::instance(), &shared_ca()).expect("start");
        let t = token(&plain, "60").await.body;
        let ipv6 = get(&plain, "/latest/meta-data/ipv6", Some(&t)).await;
        assert_eq!(ipv6.status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn token_flow_and_metadata() {
        let instance = instance();
        let imds = Imds::start(&instance, &shared_ca()).expect("start");
        let issued = token(&imds, "21600").await;
        assert_eq!(issued.status, StatusCode::OK);
        assert_eq!(issued.body.len(), 56);
        assert_eq!(issued.headers[TTL_HEADER], "21600");
        let t = Some(issued.body.as_str());

        assert_eq!(
            get(&imds, "/latest/meta-data/instance-id", None)
                .await
                .status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get(&imds, "/latest/meta-data/instance-id", Some("bogus"))
                .await
                .status,
            StatusCode::UNAUTHORIZED
        );
        // 401 comes first, even for paths that do not exist.
        assert_eq!(
            get(&imds, "/latest/nothing", None).await.status,
            StatusCode::UNAUTHORIZED
        );

        let mac = &instance.mac;
        let cases = [
            (
                "/latest/meta-data/instance-id",
                instance.instance_id.clone(),
            ),
            (
                "/latest/meta-data/local-hostname",
                "ip-10-0-1-23.us-west-2.compute.internal".into(),
            ),
            ("/latest/meta-data/local-ipv4", "10.0.1.23".into()),
            (
                "/latest/meta-data/placement/availability-zone",
                "us-west-2a".into(),
            ),
            ("/latest/meta-data/placement/region", "us-west-2".into()),
            ("/latest/meta-data/ami-id", instance.image_id.clone()),
            ("/latest/meta-data/instance-type", "m5.large".into()),
            ("/latest/meta-data/mac", mac.clone()),
            (
                &format!("/latest/meta-data/network/interfaces/macs/{mac}/local-ipv4s"),
                "10.0.1.23".into(),
            ),
            (
                &format!("/latest/meta-data/network/interfaces/macs/{mac}/local-hostname"),
                instance.local_hostname.clone(),
            ),
            (
                "/latest/meta-data/network/interfaces/macs/",
                format!("{mac}/"),
            ),
            (
                "/latest/user-data",
                "#cloud-config: none, this is the agent's config".into(),
            ),
            (
                "/latest/dynamic/instance-identity/document",
                instance.identity_document(),
            ),
            (
                "/latest/dynamic/instance-identity/rsa2048",
                imds.rsa2048().to_string(),
            ),
            (
                "/latest/dynamic/instance-identity/",
                "document\nrsa2048".into(),
            ),
            ("/latest/", "dynamic\nmeta-data\nuser-data".into()),
        ];
        for (path, expected) in cases {
            let answer = get(&imds, path, t).await;
            assert_eq!(answer.status, StatusCode::OK, "{path}");
            assert_eq!(answer.body, expected, "{path}");
        }
        let listing = get(&imds, "/latest/meta-data/", t).await.body;
        let entries: Vec<&str> = listing.split('\n').collect();
        for entry in [
            "ami-id",
            "instance-id",
            "local-hostname",
            "local-ipv4",
            "mac",
            "network/",
            "placement/",
        ] {
            assert!(entries.contains(&entry), "{entry} missing from {listing:?}");
        }
        assert!(!listing.ends_with('\n'));
        assert_eq!(imds.document(), instance.identity_document());
    }

    #[tokio::test]
    async fn refusals_like_aws() {
        let imds = Imds::start(&Instance::builder().build(), &shared_ca()).expect("start");
        let issued = token(&imds, "60").await.body;
        let t = Some(issued.as_str());
        for path in [
            "/latest/meta-data/nope",
            "/latest/user-data", // none given: 404, as AWS does
            "/latest/dynamic/instance-identity/pkcs7",
            "/latest/dynamic/instance-identity/signature",
            "/latest/meta-data/instance-id/deeper",
        ] {
            let answer = get(&imds, path, t).await;
            assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}");
            assert!(answer.body.contains("404 - Not Found"));
        }
        for ttl in ["0", "21601", "-1", "abc", ""] {
            assert_eq!(
                token(&imds, ttl).await.status,
                StatusCode::BAD_REQUEST,
                "ttl {ttl:?}"
            );
        }
        assert_eq!(token(&imds, "1").await.status, StatusCode::OK);
        let url = format!("{}/latest/api/token", imds.url());
        let no_ttl = send("PUT", &url, &[], "").await.expect("PUT");
        assert_eq!(no_ttl.status, StatusCode::BAD_REQUEST);
        let proxied = [
            ("X-aws-ec2-metadata-token-ttl-seconds", "60"),
            ("X-Forwarded-For", "10.0.0.1"),
        ];
        assert_eq!(
            send("PUT", &url, &proxied, "").await.expect("PUT").status,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            get(&imds, "/latest/api/token", t).await.status,
            StatusCode::METHOD_NOT_ALLOWED
        );
        let post = send(
            "POST",
            &format!("{}/latest/meta-data/", imds.url()),
            &[],
            "",
        )
        .await
        .expect("POST");
        assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn tokens_expire_and_can_be_invalidated() {
        let imds = Imds::start(&Instance::builder().build(), &shared_ca()).expect("start");
        let short = token(&imds, "1").await.body;
        let long = token(&imds, "600").await.body;
        assert_eq!(
            get(&imds, "/latest/meta-data/", Some(&short)).await.status,
            StatusCode::OK
        );
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(
            get(&imds, "/latest/meta-data/", Some(&short)).await.status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get(&imds, "/latest/meta-data/", Some(&long)).await.status,
            StatusCode::OK
        );
        imds.invalidate_tokens();
        assert_eq!(
            get(&imds, "/latest/meta-data/", Some(&long)).await.status,
            StatusCode::UNAUTHORIZED
        );
        let fresh = token(&imds, "600").await.body;
        assert_eq!(
            get(&imds, "/latest/meta-data/", Some(&fresh)).await.status,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn faults_on_demand() {
        let imds = Imds::start(&Instance::builder().build(), &shared_ca()).expect("start");
        imds.faults().fail_next(2, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            token(&imds, "60").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            token(&imds, "60").await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(token(&imds, "60").await.status, StatusCode::OK);

        imds.faults().set_delay(Duration::from_millis(300));
        let started = Instant::now();
        assert_eq!(token(&imds, "60").await.status, StatusCode::OK);
        assert!(started.elapsed() >= Duration::from_millis(300));
        imds.faults().clear();
        let started = Instant::now();
        token(&imds, "60").await;
        assert!(started.elapsed() < Duration::from_millis(300));
    }

    #[tokio::test]
    async fn late_start_refuses_connections_until_then() {
        let socket = BoundSocket::loopback().expect("bind");
        let instance = Instance::builder().build();
        let delay = Some(Duration::from_millis(500));
        let imds = Imds::start_on(socket, &instance, &shared_ca(), delay).expect("start");
        let refused = tokio::net::TcpStream::connect(imds.addr()).await;
        assert_eq!(
            refused.expect_err("not listening yet").kind(),
            std::io::ErrorKind::ConnectionRefused
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(token(&imds, "60").await.status, StatusCode::OK);
    }

    #[tokio::test]
    async fn stops_on_drop() {
        let imds = Imds::start(&Instance::builder().build(), &shared_ca()).expect("start");
        let addr = imds.addr();
        drop(imds);
        tokio::task::yield_now().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
