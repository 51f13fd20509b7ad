//! An HTTP CONNECT proxy stand-in, the egress proxy of a locked-down VPC.
//!
//! It listens where the test puts it (usually inside a node's network
//! namespace, see [`crate::network::netns::NetNs::listen`]) and dials out from the
//! test's own namespace, as a real proxy dials out from its own host. It
//! records every request it gets (method, target, `Proxy-Authorization`),
//! can demand credentials (407 without the right ones), answers 502 when
//! it cannot reach the target, and relays bytes both ways otherwise, so
//! TLS runs end to end between the agent and the server.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Context as _;
use base64::Engine as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The variables through which a test's own environment could leak a
/// proxy into an agent it runs.
pub const PROXY_ENV: [&str; 4] = ["HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"];
/// A request head longer than this is not a proxy request.
const MAX_HEAD: usize = 16 * 1024;

/// One request the proxy got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    /// `host:port` for CONNECT; the request target otherwise.
    pub target: String,
    /// The `Proxy-Authorization` header, as sent.
    pub authorization: Option<String>,
    /// The status the proxy answered.
    pub status: u16,
}

/// A running proxy; it stops, with every tunnel, on drop.
#[derive(Debug)]
pub struct ConnectProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl ConnectProxy {
    /// Serves on `listener` (already listening); with `credentials`, only
    /// requests carrying them as `Proxy-Authorization: Basic` get through.
    /// Must be called within a tokio runtime.
    pub fn start(
        listener: std::net::TcpListener,
        credentials: Option<(&str, &str)>,
    ) -> anyhow::Result<Self> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener).context("proxy listener")?;
        let expected = credentials.map(|(user, password)| {
            let pair = format!("{user}:{password}");
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        });
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(serve(listener, expected, seen.clone()));
        Ok(Self { addr, seen, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, or with `user:password@` in front of the address.
    pub fn url(&self, credentials: Option<(&str, &str)>) -> String {
        match credentials {
            Some((user, password)) => format!("http://{user}:{password}@{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Seen>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, expected: Option<String>, seen: Arc<Mutex<Vec<Seen>>>) {
    // Dropping the set (task aborted) closes every tunnel with it.
    let mut tunnels = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tunnels.spawn(handle(stream, expected.clone(), seen.clone()));
                }
                Err(e) => eprintln!("proxy stand-in: accept failed: {e}"),
            },
            Some(_) = tunnels.join_next() => {}
        }
    }
}

/// One client connection: a request head, an answer, then a tunnel.
async fn handle(mut client: TcpStream, expected: Option<String>, seen: Arc<Mutex<Vec<Seen>>>) {
    let Some(head) = read_head(&mut client).await else {
        return;
    };
    let mut lines = head.lines();
    let mut words = lines.next().unwrap_or_default().split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let target = words.next().unwrap_or_default().to_string();
    let authorization = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("proxy-authorization"))
        .map(|(_, value)| value.trim().to_string());
    let mut upstream = None;
    let status = if method != "CONNECT" {
        405
    } else if expected.is_some() && authorization != expected {
        407
    } else {
        match TcpStream::connect(target.as_str()).await {
            Ok(stream) => {
                upstream = Some(stream);
                200
            }
            Err(_) => 502,
        }
    };
    let record = Seen {
        method,
        target,
        authorization,
        status,
    };
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(record);
    let answer = match status {
        200 => "HTTP/1.1 200 Connection established\r\n\r\n",
        407 => "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"egress\"\r\ncontent-length: 0\r\n\r\n",
        405 => "HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n",
        _ => "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n",
    };
    if client.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    if let Some(mut upstream) = upstream {
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    }
}

/// The request head, read byte by byte so nothing of the tunnel is eaten.
async fn read_head(client: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return None;
        }
        head.push(client.read_u8().await.ok()?);
    }
    String::from_utf8(head).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn ask(proxy: &ConnectProxy, head: &str) -> (String, TcpStream) {
        let mut stream = TcpStream::connect(proxy.addr()).await.expect("connect");
        stream.write_all(head.as_bytes()).await.expect("write");
        let answer = read_head(&mut stream).await.expect("an answer");
        (answer, stream)
    }

    #[tokio::test]
    async fn tunnels_with_credentials_and_refuses_without() {
        let target = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target_addr = target.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = target.accept().await {
                let _ = stream.write_all(b"hello").await;
            }
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let proxy = ConnectProxy::start(listener, Some(("u", "p"))).expect("start");

        let connect = format!("CONNECT {target_addr} HTTP/1.1\r\nHost: {target_addr}\r\n");
        let (answer, _) = ask(&proxy, &format!("{connect}\r\n")).await;
        assert!(answer.starts_with("HTTP/1.1 407"), "{answer}");
        let with = format!("{connect}Proxy-Authorization: Basic dTpw\r\n\r\n");
        let (answer, mut tunnel) = ask(&proxy, &with).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let mut greeting = [0u8; 5];
        tunnel.read_exact(&mut greeting).await.expect("read");
        assert_eq!(&greeting, b"hello");
        let (answer, _) = ask(&proxy, "GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");

        let seen = proxy.seen();
        let statuses: Vec<u16> = seen.iter().map(|s| s.status).collect();
        assert_eq!(statuses, [407, 200, 405]);
        assert_eq!(seen[1].target, target_addr.to_string());
        assert_eq!(seen[1].authorization.as_deref(), Some("Basic dTpw"));
    }

    #[tokio::test]
    async fn unreachable_targets_are_502() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let closed_addr = closed.local_addr().expect("addr");
        drop(closed);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let proxy = ConnectProxy::start(listener, None).expect("start");
        let head = format!("CONNECT {closed_addr} HTTP/1.1\r\n\r\n");
        let (answer, _) = ask(&proxy, &head).await;
        assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
        assert_eq!(proxy.seen()[0].authorization, None);
    }
}
