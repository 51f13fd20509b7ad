//! The join API: HTTPS, small bodies, short timeouts, bounded concurrency.
//!
//! Machines that are not yet nodes talk to this endpoint, so it assumes
//! nothing of its callers: a connection must finish its TLS handshake and
//! headers quickly, a body is read only up to [`MAX_REQUEST_BYTES`] and
//! within [`BODY_TIMEOUT`], and past [`Limits::max_concurrent_joins`] a join
//! is answered 503 with `Retry-After` at once instead of queueing.

use crate::join::{self, JoinContext};
use crate::refusal::JoinError;
use crate::report::{self, ReportContext};
use autonode_shared::protocol::{
    ErrorResponse, JoinRequest, ReportRequest, JOIN_PATH, MAX_REQUEST_BYTES, REPORT_PATH,
    REQUEST_ID_HEADER,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// Time allowed for the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for the request headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for the request body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Load limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Joins processed at once; more are told to come back.
    pub max_concurrent_joins: usize,
    /// Open connections at once; more are closed on accept.
    pub max_connections: usize,
    /// Seconds a refused-for-load caller is told to wait.
    pub retry_after_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_joins: 256,
            max_connections: 4096,
            retry_after_secs: 2,
        }
    }
}

/// State shared by every connection.
pub struct Api {
    pub join: Arc<JoinContext>,
    pub report: Arc<ReportContext>,
    pub joins: Semaphore,
    pub connections: Arc<Semaphore>,
    pub limits: Limits,
}

impl Api {
    pub fn new(join: Arc<JoinContext>, report: Arc<ReportContext>, limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            join,
            report,
            joins: Semaphore::new(limits.max_concurrent_joins),
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
        })
    }
}

/// Accepts connections forever.
pub async fn serve(listener: TcpListener, tls: TlsAcceptor, api: Arc<Api>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = api.connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "connection limit reached; closing");
            continue;
        };
        // Without it, Nagle holds the answer back until the agent ACKs the
        // TLS session tickets sent after the handshake, which its delayed
        // ACK postpones: a join's p50 was 53 ms without, 28 ms with
        // (tests/bench/run with this line switched off by hand, then on).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY not set");
        }
        let (tls, api) = (tls.clone(), api.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let service = hyper::service::service_fn(move |req| route(api.clone(), req));
            let result = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

type Reply = Response<Full<Bytes>>;

async fn route(api: Arc<Api>, req: Request<Incoming>) -> Result<Reply, std::convert::Infallible> {
    let request_id = new_request_id();
    let started = std::time::Instant::now();
    let path = req.uri().path().to_string();
    let reply = match (req.method(), path.as_str()) {
        (&Method::POST, JOIN_PATH) => handle_join(&api, &request_id, req).await,
        (&Method::POST, REPORT_PATH) => handle_report(&api, &request_id, req).await,
        (_, JOIN_PATH | REPORT_PATH) => {
            error(StatusCode::METHOD_NOT_ALLOWED, "use POST", &request_id)
        }
        _ => error(StatusCode::NOT_FOUND, "no such endpoint", &request_id),
    };
    tracing::debug!(
        request_id,
        path,
        status = reply.status().as_u16(),
        ms = started.elapsed().as_secs_f64() * 1000.0,
        "request served"
    );
    Ok(with_request_id(reply, &request_id))
}

async fn handle_join(api: &Api, request_id: &str, req: Request<Incoming>) -> Reply {
    let Ok(_permit) = api.joins.try_acquire() else {
        tracing::info!(
            request_id,
            "join concurrency limit reached; asking to retry"
        );
        let mut reply = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy, retry later",
            request_id,
        );
        reply
            .headers_mut()
            .insert(RETRY_AFTER, api.limits.retry_after_secs.into());
        return reply;
    };
    let request: JoinRequest = match read_json(req, request_id).await {
        Ok(request) => request,
        Err(reply) => return reply,
    };
    match join::handle(&api.join, request_id, request).await {
        Ok(response) => json(StatusCode::OK, &response),
        Err(JoinError::Refused(_)) => error(StatusCode::FORBIDDEN, "join refused", request_id),
        Err(JoinError::Unavailable(_)) => {
            let mut reply = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily unavailable",
                request_id,
            );
            reply
                .headers_mut()
                .insert(RETRY_AFTER, api.limits.retry_after_secs.into());
            reply
        }
    }
}

async fn handle_report(api: &Api, request_id: &str, req: Request<Incoming>) -> Reply {
    let request: ReportRequest = match read_json(req, request_id).await {
        Ok(request) => request,
        Err(reply) => return reply,
    };
    match report::handle(&api.report, request_id, request).await {
        Ok(()) => json(StatusCode::ACCEPTED, &serde_json::json!({})),
        Err(report::ReportError::Refused(_)) => {
            error(StatusCode::FORBIDDEN, "report refused", request_id)
        }
        Err(report::ReportError::Unavailable(_)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily unavailable",
            request_id,
        ),
    }
}

/// Reads a bounded body within the body timeout and parses it.
async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
    request_id: &str,
) -> Result<T, Reply> {
    let is_json = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !is_json {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "send application/json",
            request_id,
        ));
    }
    let body = Limited::new(req.into_body(), MAX_REQUEST_BYTES);
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) => {
            tracing::info!(request_id, error = %e, "request body refused");
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large or broken",
                request_id,
            ));
        }
        Err(_) => {
            return Err(error(
                StatusCode::REQUEST_TIMEOUT,
                "request body too slow",
                request_id,
            ))
        }
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        tracing::info!(request_id, error = %e, "malformed request");
        error(StatusCode::BAD_REQUEST, "malformed request", request_id)
    })
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Reply {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut reply = Response::new(Full::new(Bytes::from(bytes)));
    *reply.status_mut() = status;
    reply.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    reply
}

fn error(status: StatusCode, message: &str, request_id: &str) -> Reply {
    json(
        status,
        &ErrorResponse {
            error: message.to_string(),
            request_id: request_id.to_string(),
        },
    )
}

fn with_request_id(mut reply: Reply, request_id: &str) -> Reply {
    if let Ok(value) = request_id.parse() {
        reply.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    reply
}

fn new_request_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}
