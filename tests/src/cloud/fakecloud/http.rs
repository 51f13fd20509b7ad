//! The HTTP plumbing the fake IMDS and EC2 share: a socket that can start
//! listening late, an accept loop on hyper 1, and fault injection.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// A TCP socket bound to an address but not yet listening: until it
/// listens, connections to it are refused, which is how a late-starting
/// IMDS looks to an instance. Made without a runtime, so it can be bound
/// inside a network namespace from a plain thread (see
/// [`crate::network::netns::NetNs::bind`]); the socket keeps that namespace.
#[derive(Debug)]
pub struct BoundSocket(TcpSocket);

impl BoundSocket {
    /// Binds `addr` in the calling thread's network namespace.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        // A restarted server in the same test must be able to take the port
        // back while old connections sit in TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        Ok(Self(socket))
    }

    /// An ephemeral port on 127.0.0.1.
    pub fn loopback() -> io::Result<Self> {
        Self::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    /// Starts listening (needs a tokio runtime).
    pub(crate) fn listen(self) -> io::Result<TcpListener> {
        self.0.listen(1024)
    }
}

/// Faults a test can switch on for one server, at any time.
#[derive(Clone, Debug, Default)]
pub struct Faults(Arc<Mutex<FaultState>>);

#[derive(Debug, Default)]
struct FaultState {
    failures_left: u32,
    failure_status: Option<StatusCode>,
    delay: Duration,
    arrived: u64,
}

impl Faults {
    /// Answers the next `n` requests (of any kind) with `status`, which
    /// should be a 5xx such as 500 or 503.
    pub fn fail_next(&self, n: u32, status: StatusCode) {
        let mut state = self.lock();
        state.failures_left = n;
        state.failure_status = Some(status);
    }

    /// Delays every answer by `delay` (zero turns it off).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Back to normal service (the count of arrivals is kept).
    pub fn clear(&self) {
        let mut state = self.lock();
        *state = FaultState {
            arrived: state.arrived,
            ..FaultState::default()
        };
    }

    /// Requests that have arrived, counted before any delay: a test can
    /// tell that a client is waiting on this server right now.
    pub fn arrived(&self) -> u64 {
        self.lock().arrived
    }

    /// What to do with one request: how long to wait, and whether to fail.
    fn take(&self) -> (Duration, Option<StatusCode>) {
        let mut state = self.lock();
        state.arrived += 1;
        let failure = if state.failures_left > 0 {
            state.failures_left -= 1;
            state.failure_status
        } else {
            None
        };
        (state.delay, failure)
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a fake endpoint answers. Handlers are synchronous: the state they
/// read is in memory, and slowness is the fault layer's business.
pub(crate) trait Service: Send + Sync + 'static {
    fn handle(&self, request: Request<Bytes>) -> Response<Full<Bytes>>;
    /// The answer to an injected failure, in the endpoint's own style.
    fn fault(&self, status: StatusCode) -> Response<Full<Bytes>>;
}

/// A running server; it stops (listener and open connections) on drop.
#[derive(Debug)]
pub(crate) struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Serves `service` on `socket`, listening at once or after
    /// `listen_after`. Must be called within a tokio runtime.
    pub(crate) fn start(
        socket: BoundSocket,
        listen_after: Option<Duration>,
        faults: Faults,
        service: Arc<dyn Service>,
    ) -> io::Result<Self> {
        let addr = socket.local_addr()?;
        let task = match listen_after {
            None => {
                // Listen now so that `start` returning means "reachable".
                let listener = socket.listen()?;
                tokio::spawn(accept_loop(listener, faults, service))
            }
            Some(delay) => tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                match socket.listen() {
                    Ok(listener) => accept_loop(listener, faults, service).await,
                    Err(e) => eprintln!("fake cloud: listening on {addr} failed: {e}"),
                }
            }),
        };
        Ok(Self { addr, task })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Aborting the accept loop drops the listener and its JoinSet,
        // which aborts every connection task too.
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, faults: Faults, service: Arc<dyn Service>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, faults.clone(), Arc::clone(&service)));
                }
                Err(e) => eprintln!("fake cloud: accept failed: {e}"),
            },
            // Reap finished connections so the set does not grow forever.
            Some(_) = connections.join_next() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, faults: Faults, service: Arc<dyn Service>) {
    let handler = hyper::service::service_fn(move |request: Request<Incoming>| {
        let faults = faults.clone();
        let service = Arc::clone(&service);
        async move { answer(request, &faults, &*service).await }
    });
    let result = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), handler)
        .await;
    // Clients hanging up mid-request are routine in fault tests.
    if let Err(e) = result {
        if !e.is_incomplete_message() {
            eprintln!("fake cloud: connection error: {e}");
        }
    }
}

async fn answer(
    request: Request<Incoming>,
    faults: &Faults,
    service: &dyn Service,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let (delay, failure) = faults.take();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    Ok(match failure {
        Some(status) => service.fault(status),
        None => service.handle(Request::from_parts(parts, body)),
    })
}

/// A response with a status, headers and a body.
pub(crate) fn respond(
    status: StatusCode,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(name.as_bytes()),
            hyper::header::HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// A plain HTTP/1.1 client for the unit tests of the fake servers.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    pub(crate) struct Answer {
        pub status: StatusCode,
        pub headers: hyper::HeaderMap,
        pub body: String,
    }

    /// Sends one request on a fresh connection (no pooling: fault tests
    /// must see each connection attempt).
    pub(crate) async fn send(
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Answer, hyper_util::client::legacy::Error> {
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http();
        let mut request = Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("valid request");
        let response = client.request(request).await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}
