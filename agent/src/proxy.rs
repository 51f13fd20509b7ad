//! Reaching the join server through an HTTP proxy, and never IMDS.
//!
//! Many clusters let their nodes out only through an egress proxy. The
//! agent honours the same settings as curl and Go programs:
//!
//! - `https-proxy` in `[options]`, else `HTTPS_PROXY`, else `https_proxy`
//!   from the environment (an empty value counts as unset in the
//!   environment; `https-proxy = ""` in the config means "no proxy",
//!   whatever the environment says). Only `http://` proxies: the tunnel
//!   carries TLS to the server end to end, so the server's certificate is
//!   verified exactly as without a proxy. `http://user:pass@host:port`
//!   sends the (percent-decoded) credentials as `Proxy-Authorization:
//!   Basic`; they are never logged.
//! - `no-proxy` in `[options]`, else `NO_PROXY`, else `no_proxy`: a comma
//!   list of `*`, host names (`example.com` and `.example.com` both match
//!   `example.com` and every name under it, as curl does; `*.example.com`
//!   is read as `.example.com`), IP literals and CIDR ranges. Ports in
//!   entries are ignored.
//!
//! Only the server connection ([`crate::server_client::ServerClient`], which the
//! progress reports share) uses this module. The IMDS client connects
//! directly by construction: IMDS refuses tokens to proxied requests, and
//! a proxy would see the instance's identity.

use crate::http::{self, HttpError};
use base64::Engine as _;
use std::fmt;
use std::net::IpAddr;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The environment variables for the proxy, in the order they are read.
pub const HTTPS_PROXY_VARS: [&str; 2] = ["HTTPS_PROXY", "https_proxy"];
/// The environment variables for the exceptions, in the order they are read.
pub const NO_PROXY_VARS: [&str; 2] = ["NO_PROXY", "no_proxy"];
/// A proxy's answer to CONNECT is a status line and a few headers.
const MAX_CONNECT_HEAD: usize = 16 * 1024;

/// Why a proxy setting is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{origin}: proxy URL {shown:?} {reason}")]
    Url {
        origin: Origin,
        /// The value with any credentials replaced by `***`.
        shown: String,
        reason: String,
    },
    #[error("{origin}: entry {entry:?} {reason}")]
    NoProxy {
        origin: Origin,
        entry: String,
        reason: String,
    },
}

/// Where a setting came from, named in logs and errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A key of `[options]` in the agent's config.
    Config(&'static str),
    /// An environment variable.
    Env(&'static str),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Config(key) => write!(f, "[options] {key} in the agent config"),
            Origin::Env(var) => write!(f, "environment variable {var}"),
        }
    }
}

/// An HTTP proxy to tunnel through with CONNECT.
#[derive(Clone, PartialEq, Eq)]
pub struct Proxy {
    host: String,
    port: u16,
    /// `Basic …`, when the URL carried credentials.
    authorization: Option<String>,
    origin: Origin,
}

impl fmt::Debug for Proxy {
    // Derived Debug would print the credentials into any `{:?}` of a Config.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("address", &self.address())
            .field("credentials", &self.authorization.is_some())
            .field("origin", &self.origin)
            .finish()
    }
}

impl Proxy {
    /// Parses `http://[user[:password]@]host[:port][/]`; no scheme means
    /// `http://`, no port means 80 (as Go does).
    pub fn parse(value: &str, origin: Origin) -> Result<Self, ProxyError> {
        let value = value.trim();
        let bad = |reason: &str| ProxyError::Url {
            origin: origin.clone(),
            shown: redact(value),
            reason: reason.to_string(),
        };
        let rest = match value.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
            Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => {
                return Err(bad(
                    "uses https://: only http:// proxies are supported (the tunnel carries \
                     TLS to the server end to end either way)",
                ))
            }
            Some(_) => return Err(bad("must be an http:// URL")),
            None => value,
        };
        // The last '@' ends the credentials, so an unencoded '@' or '/' in
        // a password does not cut the URL short.
        let (userinfo, hostpart) = match rest.rfind('@') {
            Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
            None => (None, rest),
        };
        let (hostport, path) = hostpart.split_at(hostpart.find('/').unwrap_or(hostpart.len()));
        if !path.is_empty() && path != "/" {
            return Err(bad("must not have a path, query or fragment"));
        }
        let (host, port) = split_host_port(hostport).map_err(bad)?;
        let authorization = userinfo
            .map(|userinfo| basic_authorization(userinfo).map_err(bad))
            .transpose()?;
        Ok(Proxy {
            host,
            port: port.unwrap_or(80),
            authorization,
            origin,
        })
    }

    /// `host:port` (IPv6 in brackets), without credentials: safe to log.
    pub fn address(&self) -> String {
        authority(&self.host, self.port)
    }

    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// A TCP stream to `host:port` through the proxy, ready for TLS.
    pub async fn connect(&self, host: &str, port: u16) -> Result<TcpStream, HttpError> {
        let error = |reason: String| HttpError::Proxy {
            proxy: self.address(),
            reason,
        };
        let mut stream = http::connect(&self.host, self.port)
            .await
            .map_err(|e| error(e.to_string()))?;
        let target = authority(host, port);
        let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
        if let Some(authorization) = &self.authorization {
            head.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
        }
        head.push_str("\r\n");
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| error(format!("sending CONNECT: {e}")))?;
        let status = read_connect_answer(&mut stream).await.map_err(error)?;
        match status {
            200..=299 => Ok(stream),
            407 if self.authorization.is_some() => Err(error(
                "407: the proxy refused the credentials in the proxy URL".into(),
            )),
            407 => Err(error(
                "407: the proxy wants credentials (http://user:password@host:port)".into(),
            )),
            status => Err(error(format!("answered CONNECT {target} with {status}"))),
        }
    }
}

/// Reads the proxy's answer head, byte by byte so that nothing after it
/// (the server's first TLS bytes) is consumed; its status code.
async fn read_connect_answer(stream: &mut TcpStream) -> Result<u16, String> {
    let mut head = Vec::with_capacity(256);
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_CONNECT_HEAD {
            return Err(format!(
                "answer to CONNECT longer than {MAX_CONNECT_HEAD} bytes"
            ));
        }
        let byte = stream
            .read_u8()
            .await
            .map_err(|e| format!("reading the answer to CONNECT: {e}"))?;
        head.push(byte);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    match (words.next(), words.next().map(str::parse::<u16>)) {
        (Some(version), Some(Ok(status))) if version.starts_with("HTTP/1.") => Ok(status),
        _ => Err(format!("not an HTTP answer to CONNECT: {:?}", line.trim())),
    }
}

/// `host:port`, with brackets around an IPv6 host.
fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_host_port(hostport: &str) -> Result<(String, Option<u16>), &'static str> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("has an unclosed '['")?;
        host.parse::<std::net::Ipv6Addr>()
            .map_err(|_| "has an invalid IPv6 address in brackets")?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(after.strip_prefix(':').ok_or("has junk after ']'")?),
            ),
        }
    } else {
        let (host, port) = match hostport.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        };
        // A second ':' is an IPv6 address without the brackets a URL needs.
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
        if host.is_empty() || !host.chars().all(valid) {
            return Err("needs a host name, IPv4 address or [IPv6 address]");
        }
        (host, port)
    };
    let port = port
        .map(|p| p.parse::<u16>().ok().filter(|p| *p != 0))
        .map(|p| p.ok_or("has an invalid port (1-65535)"))
        .transpose()?;
    Ok((host.to_ascii_lowercase(), port))
}

/// `Basic base64(user:password)` from URL userinfo (percent-encoded).
fn basic_authorization(userinfo: &str) -> Result<String, &'static str> {
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let bad = "has invalid percent-encoding in its credentials";
    let user = percent_decode(user).ok_or(bad)?;
    let password = percent_decode(password).ok_or(bad)?;
    let pair = [user, b":".to_vec(), password].concat();
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
    Ok(format!("Basic {encoded}"))
}

fn percent_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The value with whatever sits before the last '@' (credentials) hidden.
fn redact(value: &str) -> String {
    let Some(at) = value.rfind('@') else {
        return value.to_string();
    };
    let start = value.find("://").map_or(0, |i| i + 3).min(at);
    format!("{}***{}", &value[..start], &value[at..])
}

/// One `NO_PROXY` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    All,
    /// Matches the name and every name under it.
    Domain(String),
    Ip(IpAddr),
    Net(IpAddr, u8),
}

/// Hosts reached directly even when a proxy is set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoProxy {
    rules: Vec<Rule>,
    origin: Option<Origin>,
}

impl NoProxy {
    pub fn parse(value: &str, origin: Origin) -> Result<Self, ProxyError> {
        let rules = value
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                parse_rule(entry).map_err(|reason| ProxyError::NoProxy {
                    origin: origin.clone(),
                    entry: entry.to_string(),
                    reason: reason.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(NoProxy {
            rules,
            origin: Some(origin),
        })
    }

    /// Whether `host` (a name or IP literal, IPv6 without brackets) is
    /// reached directly.
    pub fn matches(&self, host: &str) -> bool {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let ip = host.parse::<IpAddr>().ok();
        self.rules.iter().any(|rule| match (rule, ip) {
            (Rule::All, _) => true,
            (Rule::Ip(rule), Some(ip)) => *rule == ip,
            (Rule::Net(net, prefix), Some(ip)) => in_net(ip, *net, *prefix),
            (Rule::Domain(domain), None) => {
                host == *domain
                    || (host.ends_with(domain.as_str())
                        && host[..host.len() - domain.len()].ends_with('.'))
            }
            _ => false,
        })
    }
}

fn parse_rule(entry: &str) -> Result<Rule, &'static str> {
    let entry = entry.to_ascii_lowercase();
    if entry == "*" {
        return Ok(Rule::All);
    }
    if let Some((net, prefix)) = entry.split_once('/') {
        let net: IpAddr = net.parse().map_err(|_| "is not a valid CIDR range")?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = prefix
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= max)
            .ok_or("has an invalid CIDR prefix length")?;
        return Ok(Rule::Net(net, prefix));
    }
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Ok(Rule::Ip(ip));
    }
    let entry = entry.strip_prefix("*.").unwrap_or(&entry);
    let (host, _port) = split_host_port(entry)?;
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(Rule::Ip(ip));
    }
    let domain = host.trim_start_matches('.').trim_end_matches('.');
    if domain.is_empty() {
        return Err("needs a host name or IP address");
    }
    Ok(Rule::Domain(domain.to_string()))
}

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// The proxy and its exceptions, resolved from the config and environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxySettings {
    pub https_proxy: Option<Proxy>,
    pub no_proxy: NoProxy,
}

/// How the server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// No proxy is configured.
    Direct,
    /// A proxy is configured, but the server's host is in `NO_PROXY`.
    Excepted(Option<&'a Origin>),
    Proxy(&'a Proxy),
}

impl fmt::Display for Route<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::Direct => write!(f, "direct (no proxy set)"),
            Route::Excepted(Some(origin)) => {
                write!(f, "direct: the server's host matches {origin}")
            }
            Route::Excepted(None) => write!(f, "direct: the server's host is excepted"),
            Route::Proxy(proxy) => write!(
                f,
                "through the HTTP proxy {} (from {}){}",
                proxy.address(),
                proxy.origin,
                if proxy.authorization.is_some() {
                    ", with its credentials"
                } else {
                    ""
                }
            ),
        }
    }
}

impl ProxySettings {
    /// Config keys win over the environment, each key on its own; `env`
    /// looks a variable up (the process environment, or a test's map).
    pub fn resolve(
        https_proxy: Option<&str>,
        no_proxy: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ProxyError> {
        let from_env = |names: [&'static str; 2]| {
            names.into_iter().find_map(|name| {
                env(name)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (v, Origin::Env(name)))
            })
        };
        let proxy = match https_proxy {
            Some(value) => Some((value.to_string(), Origin::Config("https-proxy"))),
            None => from_env(HTTPS_PROXY_VARS),
        };
        let https_proxy = proxy
            .filter(|(value, _)| !value.trim().is_empty())
            .map(|(value, origin)| Proxy::parse(&value, origin))
            .transpose()?;
        let exceptions = match no_proxy {
            Some(value) => Some((value.to_string(), Origin::Config("no-proxy"))),
            None => from_env(NO_PROXY_VARS),
        };
        let no_proxy = exceptions
            .map(|(value, origin)| NoProxy::parse(&value, origin))
            .transpose()?
            .unwrap_or_default();
        Ok(ProxySettings {
            https_proxy,
            no_proxy,
        })
    }

    /// The settings from the process environment only.
    pub fn from_process_env(
        https_proxy: Option<&str>,
        no_proxy: Option<&str>,
    ) -> Result<Self, ProxyError> {
        Self::resolve(https_proxy, no_proxy, |name| std::env::var(name).ok())
    }

    /// How a connection to `host` goes.
    pub fn route(&self, host: &str) -> Route<'_> {
        match &self.https_proxy {
            None => Route::Direct,
            Some(_) if self.no_proxy.matches(host) => {
                Route::Excepted(self.no_proxy.origin.as_ref())
            }
            Some(proxy) => Route::Proxy(proxy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn no_proxy(value: &str) -> NoProxy {
        NoProxy::parse(value, Origin::Env("NO_PROXY")).unwrap()
    }

    #[test]
    fn no_proxy_matches_like_curl() {
        let rules = no_proxy(" example.com, .corp.internal ,*.svc.local,10.1.0.0/16, ::1 ");
        for host in [
            "example.com",
            "join.example.com",
            "EXAMPLE.com.",
            "corp.internal",
            "a.b.corp.internal",
            "svc.local",
            "x.svc.local",
            "10.1.200.3",
            "::1",
            "[::1]",
        ] {
            assert!(rules.matches(host), "{host} should be excepted");
        }
        for host in [
            "badexample.com",
            "example.com.evil",
            "notcorp.internal",
            "10.2.0.1",
            "::2",
            "com",
        ] {
            assert!(!rules.matches(host), "{host} should go through the proxy");
        }
    }

    #[test]
    fn no_proxy_ips_ports_and_star() {
        assert!(no_proxy("*").matches("anything.example"));
        assert!(no_proxy("a.example, *").matches("10.0.0.1"));
        let rules = no_proxy("join.example:8443,10.0.0.5:443,[fd00::1]:443,fd00:ab::/32");
        assert!(rules.matches("join.example"), "ports are ignored");
        assert!(rules.matches("10.0.0.5"));
        assert!(!rules.matches("10.0.0.50"));
        assert!(rules.matches("fd00::1"));
        assert!(rules.matches("fd00:ab:1::9"));
        assert!(!rules.matches("fd00:ac::9"));
        // An IP entry is not a suffix: 0.0.5 must not match 10.0.0.5.
        assert!(!no_proxy("0.0.5").matches("10.0.0.5"));
        assert!(no_proxy("0.0.0.0/0").matches("192.0.2.1"));
        assert!(!no_proxy("").matches("x"));
        assert!(!NoProxy::default().matches("x"));
    }

    #[test]
    fn bad_no_proxy_entries_are_named() {
        for value in [
            "10.0.0.0/33",
            "10.0.0.0/x",
            "nonsense/8",
            "a.example:99999",
            ".",
        ] {
            let err = NoProxy::parse(value, Origin::Config("no-proxy")).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("[options] no-proxy"), "{text}");
        }
    }

    #[test]
    fn proxy_urls_parse_and_never_show_credentials() {
        let proxy = Proxy::parse("http://proxy.corp:3128", Origin::Env("HTTPS_PROXY")).unwrap();
        assert_eq!(proxy.address(), "proxy.corp:3128");
        assert_eq!(proxy.authorization, None);
        let proxy = Proxy::parse("proxy.corp", Origin::Env("HTTPS_PROXY")).unwrap();
        assert_eq!(proxy.address(), "proxy.corp:80");
        let proxy = Proxy::parse("HTTP://[fd00::3]:8080/", Origin::Env("x")).unwrap();
        assert_eq!(proxy.address(), "[fd00::3]:8080");

        let proxy =
            Proxy::parse("http://us%40er:p%3Ass@w0rd@10.0.0.9:3128", Origin::Env("x")).unwrap();
        // base64("us@er:p:ss@w0rd")
        assert_eq!(
            proxy.authorization.as_deref(),
            Some("Basic dXNAZXI6cDpzc0B3MHJk")
        );
        let debug = format!("{proxy:?}");
        assert!(
            !debug.contains("dXNAZXI") && !debug.contains("w0rd"),
            "{debug}"
        );
        let route = ProxySettings {
            https_proxy: Some(proxy),
            no_proxy: NoProxy::default(),
        };
        let shown = route.route("join.example").to_string();
        assert!(
            shown.contains("10.0.0.9:3128") && !shown.contains("w0rd"),
            "{shown}"
        );
    }

    #[test]
    fn bad_proxy_urls_name_their_origin_and_hide_credentials() {
        for value in [
            "https://proxy:3128",
            "socks5://proxy:1080",
            "http://proxy:3128/path",
            "http://proxy:0",
            "http://proxy:http",
            "http://fd00::3:8080",
            "http://",
            "http://user:s3cret@pro xy:3128",
            "http://user:s3cr%zzt@proxy:3128",
        ] {
            let err = Proxy::parse(value, Origin::Env("https_proxy")).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("environment variable https_proxy"), "{text}");
            assert!(!text.contains("s3cr"), "{text}");
        }
    }

    fn settings(
        config: (Option<&str>, Option<&str>),
        env: &[(&str, &str)],
    ) -> Result<ProxySettings, ProxyError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ProxySettings::resolve(config.0, config.1, |name| env.get(name).cloned())
    }

    #[test]
    fn config_wins_over_the_environment_key_by_key() {
        let env = [
            ("HTTPS_PROXY", "http://env-upper:1"),
            ("https_proxy", "http://env-lower:2"),
            ("no_proxy", "join.example"),
        ];
        let from_env = settings((None, None), &env).unwrap();
        assert!(matches!(from_env.route("join.example"), Route::Excepted(_)));
        let Route::Proxy(proxy) = from_env.route("other.example") else {
            panic!("expected a proxy");
        };
        assert_eq!(proxy.address(), "env-upper:1");
        assert_eq!(proxy.origin(), &Origin::Env("HTTPS_PROXY"));

        let lower = settings((None, None), &[("HTTPS_PROXY", " "), env[1]]).unwrap();
        assert_eq!(lower.https_proxy.unwrap().address(), "env-lower:2");

        let config = settings((Some("http://conf:3"), None), &env).unwrap();
        let Route::Proxy(proxy) = config.route("other.example") else {
            panic!("expected a proxy");
        };
        assert_eq!(proxy.address(), "conf:3");
        assert_eq!(proxy.origin(), &Origin::Config("https-proxy"));
        // The environment's NO_PROXY still applies to the config's proxy.
        assert!(matches!(config.route("join.example"), Route::Excepted(_)));

        // An empty config value turns the environment's proxy off.
        let off = settings((Some(""), Some("")), &env).unwrap();
        assert_eq!(off.route("other.example"), Route::Direct);
        assert_eq!(
            settings((None, None), &[]).unwrap().route("x"),
            Route::Direct
        );
    }

    #[test]
    fn invalid_environment_proxy_is_an_error_naming_the_variable() {
        let err = settings((None, None), &[("https_proxy", "ftp://x")]).unwrap_err();
        assert!(err.to_string().contains("https_proxy"), "{err}");
        // The config replaces a broken environment value entirely.
        assert!(settings((Some("http://ok:1"), None), &[("HTTPS_PROXY", "ftp://x")]).is_ok());
    }

    /// A one-connection proxy: answers CONNECT with `answer` and echoes
    /// what follows. Returns its address and the request head it got.
    async fn proxy_stub(answer: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                head.push(stream.read_u8().await.unwrap());
            }
            stream.write_all(answer.as_bytes()).await.unwrap();
            let mut echo = [0u8; 4];
            if stream.read_exact(&mut echo).await.is_ok() {
                stream.write_all(&echo).await.unwrap();
            }
            String::from_utf8(head).unwrap()
        });
        (port, task)
    }

    #[tokio::test]
    async fn connect_tunnels_and_sends_credentials() {
        let (port, head) =
            proxy_stub("HTTP/1.1 200 Connection established\r\nVia: stub\r\n\r\n").await;
        let url = format!("http://u:p@127.0.0.1:{port}");
        let proxy = Proxy::parse(&url, Origin::Env("HTTPS_PROXY")).unwrap();
        let mut tunnel = proxy.connect("fd00::7", 8443).await.unwrap();
        tunnel.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        tunnel.read_exact(&mut echo).await.unwrap();
        assert_eq!(
            &echo, b"ping",
            "bytes after the answer head reach the caller"
        );
        let head = head.await.unwrap();
        assert!(
            head.starts_with("CONNECT [fd00::7]:8443 HTTP/1.1\r\n"),
            "{head}"
        );
        // base64("u:p")
        assert!(
            head.contains("Proxy-Authorization: Basic dTpw\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn connect_refusals_say_what_the_proxy_wants() {
        let (port, _) = proxy_stub("HTTP/1.1 407 Proxy Authentication Required\r\n\r\n").await;
        let proxy = Proxy::parse(&format!("127.0.0.1:{port}"), Origin::Env("x")).unwrap();
        let err = proxy.connect("join.example", 443).await.unwrap_err();
        assert!(err.to_string().contains("wants credentials"), "{err}");
        let (port, _) = proxy_stub("HTTP/1.0 403 Forbidden\r\n\r\n").await;
        let proxy = Proxy::parse(&format!("127.0.0.1:{port}"), Origin::Env("x")).unwrap();
        let err = proxy.connect("join.example", 443).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("403") && text.contains("join.example:443"),
            "{text}"
        );
        let (port, _) = proxy_stub("SSH-2.0-OpenSSH\r\n\r\n").await;
        let proxy = Proxy::parse(&format!("127.0.0.1:{port}"), Origin::Env("x")).unwrap();
        let err = proxy.connect("join.example", 443).await.unwrap_err();
        assert!(err.to_string().contains("not an HTTP answer"), "{err}");
    }
}
