//! A bound on the requests the server has in flight to the API server at
//! once, watches apart.
//!
//! kube's client speaks HTTP/1.1, so every request in flight holds a TLS
//! connection of its own, and its pool opens one whenever none is idle. In
//! a burst the joins, the approver and the feedback controller had some
//! 450 requests in flight at once, so the server made (and kube-apiserver
//! answered) 450 TLS handshakes and kept 450 connections open afterwards:
//! about 5% of the server's CPU in the burst, for no throughput, since
//! kube-apiserver serves them with the cores it has and queues the rest
//! anyway (client-go sends all of a client's requests over one HTTP/2
//! connection). Past the bound a request waits here, in order of arrival,
//! for one in flight to finish; it holds its place until its response's
//! body is read or dropped, as the connection is busy until then.
//!
//! Watches are not counted: each holds its connection for as long as it
//! runs, and the server's caches would otherwise take places for good.

use http::{Request, Response};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::{Layer, Service};

/// Limits the requests below it to a number in flight; see the module.
#[derive(Clone)]
pub struct InFlightLayer {
    places: Arc<Semaphore>,
}

impl InFlightLayer {
    /// At most `limit` requests (at least one) in flight at once, watches
    /// apart.
    pub fn new(limit: usize) -> Self {
        Self {
            places: Arc::new(Semaphore::new(limit.max(1))),
        }
    }
}

impl<S> Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight {
            inner,
            places: self.places.clone(),
        }
    }
}

/// [`InFlightLayer`]'s service.
pub struct InFlight<S> {
    inner: S,
    places: Arc<Semaphore>,
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for InFlight<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<Held<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let places = (!is_watch(&request)).then(|| self.places.clone());
        // The client below sends nothing until its future is first polled
        // (hyper's pool takes or opens a connection then), so the place is
        // taken before a connection is.
        let response = self.inner.call(request);
        Box::pin(async move {
            let place = match places {
                // The semaphore is never closed: `None` cannot happen.
                Some(places) => places.acquire_owned().await.ok(),
                None => None,
            };
            let response = response.await?;
            Ok(response.map(|body| Held { body, place }))
        })
    }
}

/// Whether `request` is a watch (`watch=true` or `watch=1`, as kube and
/// client-go send it).
fn is_watch<B>(request: &Request<B>) -> bool {
    request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1")
    })
}

/// A response body that keeps its request's place until it is read to the
/// end or dropped.
pub struct Held<B> {
    body: B,
    place: Option<OwnedSemaphorePermit>,
}

impl<B> http_body::Body for Held<B>
where
    B: http_body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.place = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    /// A service that counts how many of its responses' bodies are alive.
    #[derive(Clone)]
    struct Counting(Arc<AtomicUsize>);

    impl Service<Request<()>> for Counting {
        type Response = Response<Full<bytes::Bytes>>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(Response::new(Full::new("ok".into()))))
        }
    }

    fn request(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[tokio::test]
    async fn a_request_past_the_bound_waits_for_a_body_to_be_read() {
        let layer = InFlightLayer::new(1);
        let calls = Arc::new(AtomicUsize::new(0));
        let mut first = layer.layer(Counting(calls.clone()));
        let second = layer.layer(Counting(calls.clone()));
        let held = first
            .ready()
            .await
            .unwrap()
            .call(request("/api/v1/nodes/a"));
        let held = held.await.unwrap();
        let mut waiting = Box::pin(second.oneshot(request("/api/v1/nodes/b")));
        let polled = futures::poll!(&mut waiting);
        assert!(
            polled.is_pending(),
            "a second request went past a bound of one"
        );
        let body = held.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
        let polled = futures::poll!(&mut waiting);
        assert!(
            polled.is_ready(),
            "the place was not given back with the body"
        );
    }

    #[tokio::test]
    async fn a_dropped_body_gives_its_place_back_and_watches_take_none() {
        let layer = InFlightLayer::new(1);
        let calls = Arc::new(AtomicUsize::new(0));
        let service = layer.layer(Counting(calls.clone()));
        let watch = service.oneshot(request("/api/v1/nodes?watch=true&timeoutSeconds=290"));
        let watch = watch.await.unwrap();
        let service = layer.layer(Counting(calls.clone()));
        let mut one = Box::pin(service.oneshot(request("/api/v1/nodes")));
        let std::task::Poll::Ready(one) = futures::poll!(&mut one) else {
            panic!("a running watch took the only place");
        };
        drop(one);
        let service = layer.layer(Counting(calls.clone()));
        let mut two = Box::pin(service.oneshot(request("/api/v1/nodes")));
        let polled = futures::poll!(&mut two);
        assert!(
            polled.is_ready(),
            "a watch or a dropped body kept its place"
        );
        drop(watch);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn only_watches_are_watches() {
        assert!(is_watch(&request("/api/v1/nodes?watch=true")));
        assert!(is_watch(&request("/api/v1/nodes?labelSelector=a&watch=1")));
        assert!(!is_watch(&request("/api/v1/nodes?watch=false")));
        assert!(!is_watch(&request(
            "/api/v1/nodes?labelSelector=watch%3Dtrue"
        )));
        assert!(!is_watch(&request("/api/v1/nodes/watch")));
    }
}
