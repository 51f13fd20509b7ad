//! Whether a watch-backed cache has had its first full list, for any
//! number of waiters.
//!
//! kube-runtime's `Store::wait_until_ready` keeps a single waker (a oneshot
//! receiver behind a mutex): when several tasks wait on it, only the one
//! that polled last is woken when the list arrives, and the others sleep on.
//! A server restarted under a burst had every arriving join waiting on its
//! NodeClaim cache, and the task that was to mark it ready never woke:
//! `/readyz` stayed 503 for good (reproduced in one run of five of
//! `resilience::a_server_killed_mid_burst_restarts_and_every_node_joins`).
//! Polling it once to ask "ready yet?" also replaced a real waiter's waker.
//! The watch loop that applies the list sets this flag instead, and a tokio
//! `watch` channel wakes every waiter.

use tokio::sync::watch;

/// Set by the task that applies a cache's watch events.
#[derive(Debug)]
pub struct SyncedSetter {
    tx: watch::Sender<bool>,
}

/// Read by anyone who needs the cache listed; cheap to clone.
#[derive(Debug, Clone)]
pub struct Synced {
    rx: watch::Receiver<bool>,
}

/// The cache's watch loop ended before its first list.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the cache's watch ended before its first list")]
pub struct WatchEnded;

/// A new flag, not yet set.
pub fn flag() -> (SyncedSetter, Synced) {
    let (tx, rx) = watch::channel(false);
    (SyncedSetter { tx }, Synced { rx })
}

impl SyncedSetter {
    /// The first full list has been applied to the store.
    pub fn set(&self) {
        self.tx
            .send_if_modified(|synced| !std::mem::replace(synced, true));
    }
}

impl Synced {
    pub fn is_synced(&self) -> bool {
        *self.rx.borrow()
    }

    /// Waits until the first full list has been applied.
    pub async fn wait(&self) -> Result<(), WatchEnded> {
        let mut rx = self.rx.clone();
        rx.wait_for(|synced| *synced)
            .await
            .map(|_| ())
            .map_err(|_| WatchEnded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn every_waiter_wakes() {
        let (setter, synced) = flag();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let synced = synced.clone();
                tokio::spawn(async move { synced.wait().await })
            })
            .collect();
        // Let them all register before the list "arrives".
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!synced.is_synced());
        setter.set();
        for waiter in waiters {
            let woke = tokio::time::timeout(Duration::from_secs(5), waiter).await;
            assert!(matches!(woke, Ok(Ok(Ok(())))), "a waiter slept on");
        }
        assert!(synced.is_synced());
        // Later waiters return at once.
        synced.wait().await.unwrap();
    }

    #[tokio::test]
    async fn waiters_hear_when_the_watch_ends_unlisted() {
        let (setter, synced) = flag();
        let waiter = tokio::spawn(async move { synced.wait().await });
        drop(setter);
        assert!(waiter.await.unwrap().is_err());
    }
}
