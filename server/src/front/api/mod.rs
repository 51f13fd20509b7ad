//! The join API: HTTPS, small bodies, short timeouts, bounded concurrency.
//!
//! Machines that are not yet nodes talk to this endpoint, so it assumes
//! nothing of its callers. Past the global or its source's connection cap
//! (`gate`) a connection takes the place of the one longest not inside a
//! join or report, or is closed on accept if there is none; it must finish
//! its TLS handshake within [`Limits::handshake_timeout`]. Its ClientHello
//! is answered (the server's signature) under a place of the handshake caps
//! (`gate`: [`Limits::max_handshakes`] at once, off the worker threads,
//! waited for in order of arrival; [`Limits::max_handshakes_per_source`]
//! waiting or answered per source), so a flood of ClientHellos costs the
//! worker threads little and waits its turn. It must then send its
//! headers (again after each answer, when kept alive), then its body (at
//! most [`MAX_REQUEST_BYTES`]), each within [`Limits::body_timeout`]. Only a
//! join or a report keeps a connection alive: after any other request (an
//! unknown path, a wrong method, a body that is not a join or a report)
//! the server closes it, so a cheap request every second does not keep a
//! place. Agents send one request per connection, and always have. A
//! refused join or report (403) closes it too, and counts into its
//! source's budget of refusals (`refusals`): a source refused faster than
//! [`Limits::refusals_per_source`] a second waits before its next
//! handshake.
//!
//! A join is admitted ([`join::admit`]: parsed, its document verified and
//! within policy) before it takes a join permit, so neither a slow body nor
//! a document that will never pass holds one. Past its source's join cap it
//! is answered 429 at once; past the global one it waits its turn up to
//! [`Limits::join_queue_wait`], or is answered 503 at once when the queue
//! is longer than that wait can serve (`queue`). Both carry `Retry-After`
//! (the caller's turn, when the queue is that long) and close the
//! connection.

mod gate;
mod queue;
mod refusals;

pub use gate::{Limits, Turned};

use crate::front::tls::{self, Unanswered};
use crate::join::refusal::JoinError;
use crate::join::{self, JoinContext};
use crate::kube::metrics::Metrics;
use crate::report::{self, ReportContext};
use autonode_shared::protocol::{
    Attestation, ChallengeRequest, ErrorResponse, JoinRequest, JoinRequestV2, ReportRequest,
    CHALLENGE_PATH, JOIN_PATH, JOIN_V2_PATH, MAX_REQUEST_BYTES, PATIENCE_HEADER, REPORT_PATH,
    REQUEST_ID_HEADER,
};
use bytes::Bytes;
use gate::{Gate, Ticket};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use queue::Caller;
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{timeout_at, Instant};
use tokio_rustls::server::TlsStream;
use tokio_rustls::LazyConfigAcceptor;

/// State shared by every connection.
pub struct Api {
    pub join: Arc<JoinContext>,
    pub report: Arc<ReportContext>,
    pub limits: Limits,
    gate: Gate,
}

impl Api {
    pub fn new(
        join: Arc<JoinContext>,
        report: Arc<ReportContext>,
        limits: Limits,
        metrics: Metrics,
    ) -> Arc<Self> {
        Arc::new(Self {
            join,
            report,
            gate: Gate::new(&limits, metrics),
            limits,
        })
    }
}

/// Accepts connections forever.
pub async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, api: Arc<Api>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Refused before the handshake: what the caps protect is what a
        // handshake would cost.
        let ticket = match api.gate.connection(peer.ip()) {
            Ok(ticket) => Arc::new(ticket),
            Err(why) => {
                api.gate.turned(why, peer.ip(), None);
                continue;
            }
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
            tokio::select! {
                () = connection(api, tls, stream, peer, ticket.clone()) => {}
                () = ticket.closed() => {
                    tracing::debug!(%peer, "connection closed to make room for a newcomer");
                }
            }
        });
    }
}

/// One connection: the handshake, then HTTP/1.1 requests until it closes.
async fn connection(
    api: Arc<Api>,
    tls: Arc<rustls::ServerConfig>,
    stream: TcpStream,
    peer: SocketAddr,
    ticket: Arc<Ticket>,
) {
    let deadline = Instant::now() + api.limits.handshake_timeout;
    let stream = match handshake(&api, tls, stream, peer.ip(), deadline).await {
        Ok(stream) => stream,
        Err(Unshaken::Turned(why)) => return api.gate.turned(why, peer.ip(), None),
        Err(Unshaken::Failed(e)) => {
            return tracing::debug!(%peer, error = %e, "TLS handshake failed")
        }
    };
    let header_timeout = api.limits.body_timeout;
    let service_api = api.clone();
    let service = hyper::service::service_fn(move |req| {
        route(service_api.clone(), peer, ticket.clone(), req)
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    match result {
        Err(e) if e.is_timeout() => api.gate.turned(Turned::HeaderTimeout, peer.ip(), None),
        Err(e) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
        Ok(()) => {}
    }
}

/// Why a handshake did not finish.
enum Unshaken {
    /// Turned away (counted): a cap or a timeout.
    Turned(Turned),
    /// The TLS exchange failed.
    Failed(std::io::Error),
}

impl From<Turned> for Unshaken {
    fn from(why: Turned) -> Self {
        Unshaken::Turned(why)
    }
}

/// The TLS handshake, by `deadline`: the ClientHello is read here; the
/// answer to it (the server's signature, the costly part) is made under a
/// place of the handshake caps, off the worker threads ([`tls::answer`]);
/// the rest (the client's Finished) is read here again.
async fn handshake(
    api: &Api,
    tls: Arc<rustls::ServerConfig>,
    stream: TcpStream,
    peer: IpAddr,
    deadline: Instant,
) -> Result<TlsStream<TcpStream>, Unshaken> {
    let late = |_| Unshaken::Turned(Turned::HandshakeTimeout);
    let hello = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    let start = timeout_at(deadline, hello)
        .await
        .map_err(late)?
        .map_err(Unshaken::Failed)?;
    let place = api.gate.handshake(peer, deadline).await?;
    let accept = match timeout_at(deadline, tls::answer(start, tls, place)).await {
        Ok(Ok(accept)) => accept,
        Ok(Err(Unanswered::HelloRetry)) => return Err(Turned::HelloRetry.into()),
        Ok(Err(e @ Unanswered::Lost(_))) => return Err(Unshaken::Failed(std::io::Error::other(e))),
        Err(elapsed) => return Err(late(elapsed)),
    };
    timeout_at(deadline, accept)
        .await
        .map_err(late)?
        .map_err(Unshaken::Failed)
}

type Reply = Response<Full<Bytes>>;

async fn route(
    api: Arc<Api>,
    peer: SocketAddr,
    ticket: Arc<Ticket>,
    req: Request<Incoming>,
) -> Result<Reply, std::convert::Infallible> {
    let request_id = new_request_id();
    let started = std::time::Instant::now();
    let path = req.uri().path().to_string();
    let (ip, id) = (peer.ip(), request_id.as_str());
    let reply = match (req.method(), path.as_str()) {
        (&Method::POST, JOIN_PATH) => handle_join::<JoinRequest>(&api, ip, &ticket, id, req).await,
        (&Method::POST, JOIN_V2_PATH) => {
            handle_join::<JoinRequestV2>(&api, ip, &ticket, id, req).await
        }
        (&Method::POST, CHALLENGE_PATH) => closing(handle_challenge(&api, ip, id, req).await),
        (&Method::POST, REPORT_PATH) => handle_report(&api, ip, &ticket, id, req).await,
        (_, JOIN_PATH | JOIN_V2_PATH | CHALLENGE_PATH | REPORT_PATH) => {
            closing(error(StatusCode::METHOD_NOT_ALLOWED, "use POST", id))
        }
        _ => closing(error(StatusCode::NOT_FOUND, "no such endpoint", id)),
    };
    tracing::debug!(
        request_id,
        %peer,
        path,
        status = reply.status().as_u16(),
        ms = started.elapsed().as_secs_f64() * 1000.0,
        "request served"
    );
    Ok(with_request_id(reply, &request_id))
}

/// A challenge: a fresh nonce, made from nothing stored (no permit, no
/// state; the connection is closed after it like any request but a join
/// or a report).
async fn handle_challenge(
    api: &Api,
    peer: IpAddr,
    request_id: &str,
    req: Request<Incoming>,
) -> Reply {
    let asked: ChallengeRequest = match read_json(api, peer, req, request_id).await {
        Ok(asked) => asked,
        Err(reply) => return reply,
    };
    let now = std::time::SystemTime::from(api.join.clock.now());
    tracing::debug!(request_id, agent = %asked.agent_version.chars().take(64).collect::<String>(), "challenge made");
    json(StatusCode::OK, &api.join.attestation.challenge(now))
}

/// A join message: `/v1`'s, or `/v2`'s with its attestation evidence.
trait JoinMessage: serde::de::DeserializeOwned {
    /// The join, and the evidence (`None` for `/v1`).
    fn split(self) -> (JoinRequest, Option<Attestation>);
}

impl JoinMessage for JoinRequest {
    fn split(self) -> (JoinRequest, Option<Attestation>) {
        (self, None)
    }
}

impl JoinMessage for JoinRequestV2 {
    fn split(self) -> (JoinRequest, Option<Attestation>) {
        let (request, evidence) = JoinRequestV2::split(self);
        (request, Some(evidence))
    }
}

/// A join through `/v1` or `/v2` (`M`): the body read and parsed, then
/// [`join_request`].
async fn handle_join<M: JoinMessage>(
    api: &Api,
    peer: IpAddr,
    ticket: &Ticket,
    request_id: &str,
    req: Request<Incoming>,
) -> Reply {
    let patience = patience(req.headers());
    let message: M = match read_json(api, peer, req, request_id).await {
        Ok(message) => message,
        Err(reply) => return closing(reply),
    };
    let (request, evidence) = message.split();
    let join = Join {
        request,
        evidence,
        patience,
    };
    join_request(api, peer, ticket, request_id, join).await
}

/// How long the agent says it will keep trying ([`PATIENCE_HEADER`]):
/// whole seconds in digits; anything else counts as not said. It only ever
/// lengthens the caller's own `Retry-After`.
fn patience(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(PATIENCE_HEADER)?.to_str().ok()?;
    if value.is_empty() || value.len() > 6 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok().map(Duration::from_secs)
}

/// A join as read from its request.
struct Join {
    request: JoinRequest,
    /// The attestation evidence (`None` for `/v1`).
    evidence: Option<Attestation>,
    /// How long the agent will keep trying, if it said.
    patience: Option<Duration>,
}

/// A join: admission (body, parse, verify) with no permit held, then a
/// place under the join caps (waiting its turn for the global one), then
/// the join. Its connection keeps its
/// place from the parsed body on.
async fn join_request(
    api: &Api,
    peer: IpAddr,
    ticket: &Ticket,
    request_id: &str,
    join: Join,
) -> Reply {
    let _busy = ticket.busy();
    let admitted = match join::admit(&api.join, request_id, join.request, join.evidence) {
        Ok(admitted) => admitted,
        Err(e) => return join_verdict(api, peer, request_id, e),
    };
    let _pass = match api.gate.join(peer).await {
        Ok(pass) => pass,
        Err(why) => {
            api.gate.turned(why, peer, Some(request_id));
            let caller = Caller {
                instance: admitted.instance_id(),
                patience: join.patience,
            };
            return closing(busy(api, why, request_id, &caller));
        }
    };
    match join::handle(&api.join, request_id, admitted).await {
        Ok(response) => json(StatusCode::OK, &response),
        Err(e) => join_verdict(api, peer, request_id, e),
    }
}

/// The answer to a caller over a join cap: 429 for its source's, 503 for
/// the global one; either way, when to come back: its turn, when the queue
/// is longer than it can serve in its wait. The connection is closed after
/// it: its buffers are not held through a wait that may last a minute.
fn busy(api: &Api, why: Turned, request_id: &str, caller: &Caller<'_>) -> Reply {
    let mut reply = if why == Turned::SourceJoins {
        error(
            StatusCode::TOO_MANY_REQUESTS,
            "too many joins from this address, retry later",
            request_id,
        )
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy, retry later",
            request_id,
        )
    };
    let after = api.gate.retry_after(caller).as_secs_f64().ceil() as u64;
    reply.headers_mut().insert(RETRY_AFTER, after.into());
    reply
}

/// The HTTP verdict on a join that did not succeed. A refusal is final:
/// the connection is closed after it and counted into `peer`'s budget.
fn join_verdict(api: &Api, peer: IpAddr, request_id: &str, e: JoinError) -> Reply {
    match e {
        JoinError::Refused(refusal) => {
            api.gate.refused(peer);
            closing(error(
                StatusCode::FORBIDDEN,
                &refusal.caller_message(),
                request_id,
            ))
        }
        JoinError::Unavailable(_) => retry_later(
            api,
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "temporarily unavailable",
                request_id,
            ),
        ),
    }
}

fn retry_later(api: &Api, mut reply: Reply) -> Reply {
    reply
        .headers_mut()
        .insert(RETRY_AFTER, api.limits.retry_after_secs.into());
    reply
}

async fn handle_report(
    api: &Api,
    peer: IpAddr,
    ticket: &Ticket,
    request_id: &str,
    req: Request<Incoming>,
) -> Reply {
    let request: ReportRequest = match read_json(api, peer, req, request_id).await {
        Ok(request) => request,
        Err(reply) => return closing(reply),
    };
    let _busy = ticket.busy();
    match report::handle(&api.report, request_id, request).await {
        Ok(()) => json(StatusCode::ACCEPTED, &serde_json::json!({})),
        Err(report::ReportError::Refused(_)) => {
            api.gate.refused(peer);
            closing(error(StatusCode::FORBIDDEN, "report refused", request_id))
        }
        Err(report::ReportError::Unavailable(_)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily unavailable",
            request_id,
        ),
        Err(e @ report::ReportError::TooMany { retry_after, .. }) => {
            let mut reply = error(StatusCode::TOO_MANY_REQUESTS, &e.to_string(), request_id);
            reply
                .headers_mut()
                .insert(RETRY_AFTER, retry_after.as_secs().max(1).into());
            reply
        }
    }
}

/// Reads a bounded body within the body timeout and parses it.
async fn read_json<T: serde::de::DeserializeOwned>(
    api: &Api,
    peer: IpAddr,
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
    let bytes = match tokio::time::timeout(api.limits.body_timeout, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) => {
            tracing::info!(request_id, error = %e, "request body refused");
            if e.is::<http_body_util::LengthLimitError>() {
                api.gate
                    .turned(Turned::BodyTooLarge, peer, Some(request_id));
            }
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large or broken",
                request_id,
            ));
        }
        Err(_) => {
            api.gate.turned(Turned::BodyTimeout, peer, Some(request_id));
            return Err(error(
                StatusCode::REQUEST_TIMEOUT,
                "request body too slow",
                request_id,
            ));
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
    reply
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
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

/// `reply`, after which the connection closes: the request was not a join
/// or a report, so the connection has no more use for its place.
fn closing(mut reply: Reply) -> Reply {
    reply
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    reply
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patience_is_whole_seconds_in_digits_or_not_said() {
        let said = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(PATIENCE_HEADER, value.parse().unwrap());
            patience(&headers)
        };
        assert_eq!(patience(&HeaderMap::new()), None);
        assert_eq!(said("540"), Some(Duration::from_secs(540)));
        assert_eq!(said("0"), Some(Duration::ZERO));
        for not in ["", "-5", "+5", "5.5", "1e3", " 5", "9999999", "ten"] {
            assert_eq!(said(not), None, "{not:?}");
        }
    }
}
