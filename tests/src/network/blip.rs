//! A TCP relay on loopback whose connections a test can cut: a network
//! blip between a client (the server) and the API server, both ends still
//! up, for as long as the test says.

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

/// Relays `127.0.0.1:<port>` to a target until dropped.
pub struct Blip {
    addr: SocketAddr,
    relays: Arc<Mutex<Vec<AbortHandle>>>,
    /// While set, new connections are closed at once.
    down: Arc<AtomicBool>,
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
        let (tracked, refusing) = (relays.clone(), down.clone());
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if refusing.load(Ordering::Acquire) {
                    continue;
                }
                let relay = tokio::spawn(crate::network::netns::relay(inbound, target));
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
