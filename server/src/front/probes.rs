//! The probes server: `/metrics`, `/healthz` and `/readyz` on a plain HTTP port.
//!
//! `/healthz` says the process serves; `/readyz` says it can judge joins
//! (its NodeClaim cache has synced and its watch is connected, and the
//! node-config caches have had their first list), so a replica that cannot
//! reach the guest cluster is taken out of the Service instead of refusing
//! machines or keeping them waiting.
//!
//! They are answered on a thread of their own ([`start`]), not on the
//! worker threads: kubelet restarts the pod when `/healthz` goes
//! unanswered for its timeout, and the worker threads are what a flood of
//! the join API (TLS handshakes, refused documents) keeps busy. A flood is
//! to be refused, not to restart the replica that refuses it.

use crate::join::render::inputs::NodeConfig;
use crate::kube::metrics::Metrics;
use crate::kube::nodeclaim::NodeClaims;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::time::Duration;
use thiserror::Error;
use tokio::net::TcpListener;

/// Why the probes could not be started.
#[derive(Debug, Error)]
pub enum ProbesError {
    #[error("the probes' runtime: {0}")]
    Runtime(std::io::Error),
    #[error("the probes' listener: {0}")]
    Listener(std::io::Error),
    #[error("the probes' thread: {0}")]
    Thread(std::io::Error),
}

/// What `/readyz` asks.
#[derive(Clone)]
pub struct Readiness {
    pub claims: NodeClaims,
    pub nodeconfig: NodeConfig,
}

impl Readiness {
    /// `Err` names what keeps joins from being judged now.
    fn check(&self) -> Result<(), String> {
        if !self.claims.is_fresh() {
            return Err(
                "NodeClaim cache not in sync (not listed since its watch started or last failed)"
                    .into(),
            );
        }
        match self.nodeconfig.unsynced() {
            Some(cache) => Err(format!("{cache} cache not synced")),
            None => Ok(()),
        }
    }
}

/// Serves the observability endpoints on `listener` forever, on a thread
/// of their own (named `probes`) with its own single-threaded runtime:
/// whatever keeps the worker threads busy, a probe is answered as soon as
/// the OS runs this thread. `metrics` and `readiness` are read there; both
/// are handles on state the worker threads keep.
pub fn start(
    listener: std::net::TcpListener,
    metrics: Metrics,
    readiness: Readiness,
) -> Result<(), ProbesError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ProbesError::Runtime)?;
    listener
        .set_nonblocking(true)
        .map_err(ProbesError::Listener)?;
    // Registered with the probes' runtime, so its readiness is polled there.
    let listener = {
        let _inside = runtime.enter();
        TcpListener::from_std(listener).map_err(ProbesError::Listener)?
    };
    std::thread::Builder::new()
        .name("probes".into())
        .spawn(move || runtime.block_on(serve(listener, metrics, readiness)))
        .map_err(ProbesError::Thread)?;
    Ok(())
}

/// Serves the observability endpoints forever (on the runtime it runs on).
async fn serve(listener: TcpListener, metrics: Metrics, readiness: Readiness) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (metrics, readiness) = (metrics.clone(), readiness.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let reply = answer(req.uri().path(), &metrics, &readiness);
                async move { Ok::<_, std::convert::Infallible>(reply) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(path: &str, metrics: &Metrics, readiness: &Readiness) -> Response<Full<Bytes>> {
    let (status, body, content_type) = match path {
        "/metrics" => {
            // Readiness is judged when asked, so the gauge is set at each
            // scrape: it says what `/readyz` would answer now.
            let ready = readiness.check().is_ok();
            metrics.caches_ready.set(i64::from(ready));
            (
                StatusCode::OK,
                metrics.render(),
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
        }
        "/healthz" => (StatusCode::OK, "ok".to_string(), "text/plain"),
        "/readyz" => match readiness.check() {
            Ok(()) => (StatusCode::OK, "ok".to_string(), "text/plain"),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why, "text/plain"),
        },
        _ => (StatusCode::NOT_FOUND, "not found".to_string(), "text/plain"),
    };
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    *reply.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        reply
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    reply
}
