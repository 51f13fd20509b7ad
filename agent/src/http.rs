//! A minimal HTTP/1.1 client on hyper: one request per connection.
//!
//! Both of the agent's peers are single endpoints it talks to a handful of
//! times, so there is no pool and no redirects. Connections here are
//! direct; the server connection may instead be tunnelled through an HTTP
//! proxy by [`crate::proxy`], which IMDS never is.
//!
//! Name resolution: an IP-literal host is connected to directly, with no
//! resolver involved, which is what a statically linked agent needs (static
//! glibc's getaddrinfo loads NSS modules at run time). Host names go through
//! the system resolver.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use std::net::{IpAddr, SocketAddr};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot resolve {host}: {reason}")]
    Resolve { host: String, reason: String },
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("TLS handshake with {host} failed: {reason}")]
    Tls { host: String, reason: String },
    #[error("HTTP exchange failed: {0}")]
    Exchange(String),
    #[error("response body larger than {0} bytes")]
    TooLarge(usize),
    #[error("timed out after {0:.1}s")]
    Timeout(f64),
    #[error("through the proxy {proxy}: {reason}")]
    Proxy { proxy: String, reason: String },
    #[error("bad URL {0:?}")]
    BadUrl(String),
}

/// An answer, body read in full.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Host and port of a URL, with the scheme's default port.
pub fn host_port(uri: &Uri) -> Result<(String, u16), HttpError> {
    let host = uri
        .host()
        .ok_or_else(|| HttpError::BadUrl(uri.to_string()))?;
    let default_port = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, uri.port_u16().unwrap_or(default_port)))
}

/// Connects to `host:port`; IP literals bypass the resolver.
pub async fn connect(host: &str, port: u16) -> Result<TcpStream, HttpError> {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| HttpError::Resolve {
                host: host.to_string(),
                reason: e.to_string(),
            })?
            .collect(),
    };
    let mut last = HttpError::Resolve {
        host: host.to_string(),
        reason: "no addresses".into(),
    };
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                // Small requests: don't wait to coalesce them.
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => {
                last = HttpError::Connect {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                }
            }
        }
    }
    Err(last)
}

/// Builds a request for `path` on `uri`'s host (hyper's connection-level
/// client sends the URI as given, so it must be origin-form plus Host).
pub fn request(
    method: Method,
    uri: &Uri,
    path: &str,
) -> Result<hyper::http::request::Builder, HttpError> {
    let authority = uri
        .authority()
        .ok_or_else(|| HttpError::BadUrl(uri.to_string()))?;
    Ok(Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, authority.as_str()))
}

/// Sends one request over `io` and reads the whole answer, at most
/// `max_body` bytes of it.
pub async fn send<S>(
    io: S,
    request: Request<Full<Bytes>>,
    max_body: usize,
) -> Result<Response, HttpError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let exchange = |e: hyper::Error| HttpError::Exchange(e.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(exchange)?;
    let driver = tokio::spawn(async move {
        // Its error also surfaces through send_request.
        let _ = connection.await;
    });
    let result = async {
        let response = sender.send_request(request).await.map_err(exchange)?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, max_body)
            .collect()
            .await
            .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
                Ok(_) => HttpError::TooLarge(max_body),
                Err(e) => HttpError::Exchange(e.to_string()),
            })?
            .to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
    .await;
    driver.abort();
    result
}

/// A `Retry-After` in seconds (the HTTP-date form is not worth a date
/// parser here; it is treated as absent).
pub fn retry_after(headers: &HeaderMap) -> Option<std::time::Duration> {
    let value = headers.get(hyper::header::RETRY_AFTER)?.to_str().ok()?;
    value
        .trim()
        .parse::<u64>()
        .ok()
        .map(std::time::Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_defaults_and_ipv6() {
        let uri: Uri = "https://[::1]:8443/x".parse().unwrap();
        assert_eq!(host_port(&uri).unwrap(), ("::1".to_string(), 8443));
        let uri: Uri = "http://169.254.169.254".parse().unwrap();
        assert_eq!(
            host_port(&uri).unwrap(),
            ("169.254.169.254".to_string(), 80)
        );
        let uri: Uri = "https://join.example".parse().unwrap();
        assert_eq!(host_port(&uri).unwrap().1, 443);
    }

    #[test]
    fn retry_after_seconds_only() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(hyper::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(
            retry_after(&headers),
            Some(std::time::Duration::from_secs(7))
        );
        headers.insert(
            hyper::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }
}
