//! Hostile callers of the join API, for the tests and the benchmark's
//! hostile burst: clients bound to a source address of their own, bodies
//! that never finish, and a stream of documents the policy refuses.
//!
//! Any address in 127.0.0.0/8 is local on Linux, so a socket bound to, say,
//! 127.0.0.2 reaches the server on 127.0.0.1 and is a source of its own to
//! the server's per-source limits.

use crate::callers::joiner::{self, Https};
use anyhow::{Context, Result};
use autonode_shared::protocol::{JoinRequest, JOIN_PATH, PATIENCE_HEADER};
use bytes::Bytes;
use futures::stream;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The attackers' source in the tests.
pub const OTHER_SOURCE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A request body of any shape.
pub type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// An HTTPS client trusting only `ca_pem`, whose connections come from
/// `source`, one per request.
pub fn client_from(ca_pem: &str, source: IpAddr) -> Result<Client<Https, Body>> {
    client_builder(ca_pem, source, 0)
}

/// Like [`client_from`], but keeping one connection alive between requests
/// (and opening a new one when the server closes it).
pub fn keep_alive_client_from(ca_pem: &str, source: IpAddr) -> Result<Client<Https, Body>> {
    client_builder(ca_pem, source, 1)
}

fn client_builder(ca_pem: &str, source: IpAddr, idle: usize) -> Result<Client<Https, Body>> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_local_address(Some(source));
    http.set_nodelay(true);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(joiner::tls_config(ca_pem)?)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(idle)
        .build(https))
}

/// POSTs `body` to `{server}/v1/join`: (status, `Retry-After`, body).
pub async fn post(
    client: &Client<Https, Body>,
    server: &str,
    body: Body,
) -> Result<(u16, Option<String>, Bytes)> {
    post_saying(client, server, body, None).await
}

/// Like [`post`], saying as an agent since 0.3.0 does how long it keeps
/// trying ([`PATIENCE_HEADER`]) when `patience` is given.
pub async fn post_saying(
    client: &Client<Https, Body>,
    server: &str,
    body: Body,
    patience: Option<Duration>,
) -> Result<(u16, Option<String>, Bytes)> {
    let mut request = hyper::Request::post(format!("{server}{JOIN_PATH}"))
        .header("content-type", "application/json");
    if let Some(patience) = patience {
        request = request.header(PATIENCE_HEADER, patience.as_secs());
    }
    let request = request.body(body)?;
    let response = client.request(request).await.context("join API request")?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, retry_after, body))
}

/// `request` as a complete JSON body.
pub fn json_body(request: &JoinRequest) -> Result<Body> {
    let bytes = Bytes::from(serde_json::to_vec(request)?);
    Ok(http_body_util::Full::new(bytes).boxed())
}

/// A body that never ends: a byte every half second.
pub fn dribble() -> Body {
    let bytes = stream::unfold((), |()| async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Some((Ok(Frame::data(Bytes::from_static(b" "))), ()))
    });
    BodyExt::boxed(StreamBody::new(bytes))
}

/// Answers seen by a [`Attackers`] stream: (status, time to answer); status
/// 0 for a connection that failed.
pub type Answers = Arc<Mutex<Vec<(u16, Duration)>>>;

/// Background attackers that stop when dropped.
#[derive(Default)]
pub struct Attackers {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Attackers {
    /// `count` callers, each sending never-ending bodies to `server`, one
    /// after another (a cut-off caller starts over at once).
    pub fn slow_bodies(&mut self, client: &Client<Https, Body>, server: &str, count: usize) {
        for _ in 0..count {
            let (client, server) = (client.clone(), server.to_string());
            self.tasks.push(tokio::spawn(async move {
                loop {
                    if post(&client, &server, dribble()).await.is_err() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }));
        }
    }

    /// One caller sending `request` to `server` over and over, recording
    /// each answer in `answers`.
    pub fn repeat(
        &mut self,
        client: &Client<Https, Body>,
        server: &str,
        request: &JoinRequest,
        answers: &Answers,
    ) -> Result<()> {
        let body = Bytes::from(serde_json::to_vec(request)?);
        let (client, server) = (client.clone(), server.to_string());
        let answers = answers.clone();
        self.tasks.push(tokio::spawn(async move {
            loop {
                let body = http_body_util::Full::new(body.clone()).boxed();
                let started = Instant::now();
                let status = post(&client, &server, body).await.map_or(0, |(s, _, _)| s);
                if let Ok(mut answers) = answers.lock() {
                    answers.push((status, started.elapsed()));
                }
                if status == 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
        Ok(())
    }
}

impl Attackers {
    /// `count` callers from `source`, each on a connection of its own kept
    /// alive, asking `server` for a page that does not exist every second
    /// (on a new connection at once when the server closes theirs). Each
    /// answer's status goes to `answers`.
    pub fn not_found_every_second(
        &mut self,
        ca_pem: &str,
        source: IpAddr,
        server: &str,
        count: usize,
        answers: &Answers,
    ) -> Result<()> {
        for _ in 0..count {
            let client = keep_alive_client_from(ca_pem, source)?;
            let (server, answers) = (server.to_string(), answers.clone());
            self.tasks.push(tokio::spawn(async move {
                loop {
                    let started = Instant::now();
                    let status = not_found(&client, &server).await.unwrap_or(0);
                    if let Ok(mut answers) = answers.lock() {
                        answers.push((status, started.elapsed()));
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }));
        }
        Ok(())
    }
}

impl Attackers {
    /// `per_source` callers from each of `sources`, each sending `server`
    /// the same ClientHello ([`client_hello`]) on a new connection, reading
    /// until the server has answered it (its signed first flight) or closed,
    /// and starting over, never finishing a handshake: what costs the
    /// server a signature and the caller nothing. The ClientHellos go in
    /// waves, every `WAVE_SECS` seconds: so most reach connections the server
    /// has accepted meanwhile (not its listener's backlog, which its accept
    /// loop drains a budget at a time), all ready to be answered at once.
    /// (A wave at most as long as the server's 3 s handshake timeout: a
    /// connection held longer is closed before its ClientHello comes.) The server's
    /// answers are counted in `answered` (a refused connection waits
    /// 500 ms before the next).
    pub fn replayed_hellos(
        &mut self,
        server: std::net::SocketAddr,
        sources: &[IpAddr],
        per_source: usize,
        answered: &Arc<std::sync::atomic::AtomicU64>,
    ) -> Result<()> {
        let hello = Bytes::from(client_hello()?);
        let waves = tokio::time::Instant::now();
        for source in sources.iter().copied() {
            for _ in 0..per_source {
                let (hello, answered) = (hello.clone(), answered.clone());
                self.tasks.push(tokio::spawn(async move {
                    loop {
                        let sent = replay_hello(server, source, &hello, waves).await;
                        if sent.unwrap_or(false) {
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        } else {
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }));
            }
        }
        Ok(())
    }
}

/// How often [`Attackers::replayed_hellos`] send their ClientHellos.
const WAVE_SECS: u64 = 3;
/// How long at least a connection is held before its ClientHello is sent.
const HELLO_HELD: Duration = Duration::from_millis(100);

/// A TLS 1.3 ClientHello for `localhost`, as an agent's rustls sends it.
pub fn client_hello() -> Result<Vec<u8>> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let name = "localhost".try_into()?;
    let mut client = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut bytes = Vec::new();
    client.write_tls(&mut bytes)?;
    Ok(bytes)
}

/// Sends `hello` from `source`: whether the server answered it (sent its
/// first flight, which holds the signature) before closing.
async fn replay_hello(
    server: std::net::SocketAddr,
    source: IpAddr,
    hello: &[u8],
    waves: tokio::time::Instant,
) -> Result<bool> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(source, 0))?;
    let mut stream = socket.connect(server).await?;
    let ready = tokio::time::Instant::now() + HELLO_HELD;
    let wave = ready.duration_since(waves).as_secs() / WAVE_SECS + 1;
    tokio::time::sleep_until(waves + Duration::from_secs(wave * WAVE_SECS)).await;
    stream.write_all(hello).await?;
    // A TLS 1.3 server's first flight with an RSA 2048 certificate is well
    // over 1 KiB; what a refusal sends (an alert, if anything) is not.
    let mut answer = vec![0; 16 * 1024];
    let mut read = 0;
    while read < 1024 {
        match stream.read(&mut answer[read..]).await? {
            0 => break,
            n => read += n,
        }
    }
    Ok(read >= 1024)
}

/// GET of a path the join API does not serve: the status.
async fn not_found(client: &Client<Https, Body>, server: &str) -> Result<u16> {
    let request = hyper::Request::get(format!("{server}/no-such-page"))
        .body(http_body_util::Empty::new().boxed())?;
    let response = client.request(request).await?;
    let status = response.status().as_u16();
    response.into_body().collect().await?;
    Ok(status)
}

impl Drop for Attackers {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
