//! A TCP relay on loopback whose connections a test can cut: a network
//! blip between a client (the server) and the API server, both ends still
//! up, for as long as the test says; or hold, every byte kept back and
//! nothing closed (a partition, an API server that stopped answering).

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// Relays `127.0.0.1:<port>` to a target until dropped.
pub struct Blip {
    addr: SocketAddr,
    relays: Arc<Mutex<Vec<AbortHandle>>>,
    /// While set, new connections are closed at once.
    down: Arc<AtomicBool>,
    /// While true, no byte passes either way (see [`Blip::hold`]).
    held: watch::Sender<bool>,
    accept: AbortHandle,
}

impl Blip {
    /// Starts relaying to `target` (`https://host:port` or `host:port`).
    pub async fn start(target: &str) -> Result<Self> {
        let target: SocketAddr = target
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .parse()
            .with_context(|| format!("{target} is not ip:port"))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let relays: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let down = Arc::new(AtomicBool::new(false));
        let (held, holding) = watch::channel(false);
        let (tracked, refusing) = (relays.clone(), down.clone());
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if refusing.load(Ordering::Acquire) {
                    continue;
                }
                let relay = tokio::spawn(relay(inbound, target, holding.clone()));
                if let Ok(mut relays) = tracked.lock() {
                    relays.retain(|r| !r.is_finished());
                    relays.push(relay.abort_handle());
                }
            }
        })
        .abort_handle();
        Ok(Self {
            addr,
            relays,
            down,
            held,
            accept,
        })
    }

    /// Where clients connect instead of the target.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Cuts every open connection and closes new ones for `length`, then
    /// relays again. Returns how many were cut.
    pub async fn outage(&self, length: Duration) -> usize {
        self.down.store(true, Ordering::Release);
        let cut = self.cut();
        tokio::time::sleep(length).await;
        self.down.store(false, Ordering::Release);
        cut
    }

    /// From now until [`Blip::release`], passes no byte either way on any
    /// connection, open or new (new ones are accepted and connected): the
    /// client's requests go unanswered and nothing is closed, as when the
    /// network between them drops everything.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Lets bytes through again after [`Blip::hold`], those kept back first.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// Closes every connection open now; later ones are relayed as before.
    /// Returns how many were cut.
    pub fn cut(&self) -> usize {
        let Ok(mut relays) = self.relays.lock() else {
            return 0;
        };
        let open: Vec<_> = relays.drain(..).filter(|r| !r.is_finished()).collect();
        for relay in &open {
            relay.abort();
        }
        open.len()
    }
}

impl Drop for Blip {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Relays one connection to `target` both ways, passing nothing while
/// `held` says so.
async fn relay(inbound: TcpStream, target: SocketAddr, held: watch::Receiver<bool>) {
    let Ok(outbound) = TcpStream::connect(target).await else {
        // Dropping the inbound side is what a client sees of a target down.
        return;
    };
    // No Nagle delay added to either side (see `netns::relay`).
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (from_client, to_client) = inbound.into_split();
    let (from_target, to_target) = outbound.into_split();
    tokio::join!(
        pump(from_client, to_target, held.clone()),
        pump(from_target, to_client, held)
    );
}

/// Copies `from` to `to` until either ends; bytes read while held wait
/// until released.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut held: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if held.wait_for(|held| !*held).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}
