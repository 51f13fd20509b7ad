//! `/metrics`, `/healthz` and `/readyz` on a plain HTTP port.
//!
//! `/healthz` says the process serves; `/readyz` says it can judge joins
//! (its NodeClaim cache has synced), so a replica that cannot reach the
//! guest cluster is taken out of the Service instead of refusing machines.

use crate::metrics::Metrics;
use crate::nodeclaim::NodeClaims;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::time::Duration;
use tokio::net::TcpListener;

/// Serves the observability endpoints forever.
pub async fn serve(listener: TcpListener, metrics: Metrics, claims: NodeClaims) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (metrics, claims) = (metrics.clone(), claims.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let reply = answer(req.uri().path(), &metrics, &claims);
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

fn answer(path: &str, metrics: &Metrics, claims: &NodeClaims) -> Response<Full<Bytes>> {
    let (status, body, content_type) = match path {
        "/metrics" => (
            StatusCode::OK,
            metrics.render(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        "/healthz" => (StatusCode::OK, "ok".to_string(), "text/plain"),
        "/readyz" if claims.is_ready() => (StatusCode::OK, "ok".to_string(), "text/plain"),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "NodeClaim cache not synced".to_string(),
            "text/plain",
        ),
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
