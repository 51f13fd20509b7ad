//! The join client against a small HTTPS server on loopback: CA pinning
//! (inline PEM and sha256 pin), retries of 5xx/429 honouring Retry-After,
//! and refusals that are final. (The real server is tested by the lead's
//! end-to-end tests; this only plays the status codes.)

use autonode_agent::config::Config;
use autonode_agent::nitrotpm::NitroTpm;
use autonode_agent::retry::Deadline;
use autonode_agent::server_client::Attester;
use autonode_agent::server_client::{JoinError, ServerClient};
use autonode_agent::trust::ServerTrust;
use autonode_shared::clock::Clock;
use autonode_shared::protocol::{
    ChallengeRequest, ChallengeResponse, InstanceIdentity, JoinRequest, JoinRequestV2,
    JoinResponse, KubeletSettings, CHALLENGE_PATH, JOIN_PATH, JOIN_V2_PATH, PATIENCE_HEADER,
};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::Digest as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Pki {
    ca_der: Vec<u8>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    Pki {
        ca_der: ca.der().to_vec(),
        chain: vec![leaf.der().clone(), ca.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
    }
}

/// Which release the scripted server plays.
#[derive(Clone, Copy, PartialEq)]
enum Release {
    /// This one: `/v2/challenge` and `/v2/join`.
    This,
    /// One of before 0.3.0: no `/v2` (404).
    Before,
    /// A rolling upgrade: challenges answered, `/v2/join` not (the join
    /// reached an older replica).
    Rolling,
}

/// Answers the n-th join with `script[n]` (the last one repeats), as a
/// server of this release: a challenge first (not counted).
async fn serve(pki: &Pki, script: Vec<(u16, Option<&'static str>)>) -> (String, Arc<AtomicU32>) {
    let (url, count, _) = serve_as(pki, script, Release::This).await;
    (url, count)
}

/// The requests the server was sent, in order: path, body, and the
/// agent's patience header.
type Seen = Arc<Mutex<Vec<(String, serde_json::Value, Option<String>)>>>;
/// The status (and `Retry-After`) of each join, in order.
type Script = Arc<Vec<(u16, Option<&'static str>)>>;

/// [`serve`], as a server of `release`; also what it was sent.
async fn serve_as(
    pki: &Pki,
    script: Vec<(u16, Option<&'static str>)>,
    release: Release,
) -> (String, Arc<AtomicU32>, Seen) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(pki.chain.clone(), pki.key.clone_key())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicU32::new(0));
    let seen: Seen = Arc::default();
    let state = (count.clone(), Arc::new(script), seen.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, state) = (acceptor.clone(), state.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let state = state.clone();
                        async move {
                            let path = request.uri().path().to_string();
                            let patience = request
                                .headers()
                                .get(PATIENCE_HEADER)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_string);
                            let body = request.into_body().collect().await?.to_bytes();
                            let asked = (path, patience);
                            Ok::<_, hyper::Error>(respond(&state, release, asked, &body))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (url, count, seen)
}

/// One answer of the scripted server.
fn respond(
    (counter, script, seen): &(Arc<AtomicU32>, Script, Seen),
    release: Release,
    (path, patience): (String, Option<String>),
    body: &[u8],
) -> Response<Full<Bytes>> {
    let value: serde_json::Value = serde_json::from_slice(body).expect("JSON");
    seen.lock().unwrap().push((path.clone(), value, patience));
    match path.as_str() {
        CHALLENGE_PATH if release != Release::Before => {
            let _: ChallengeRequest = serde_json::from_slice(body).expect("a ChallengeRequest");
            let nonce = ChallengeResponse {
                nonce: "bm9uY2U=".into(),
                expires_in_seconds: 120,
            };
            let mut reply =
                Response::new(Full::new(Bytes::from(serde_json::to_vec(&nonce).unwrap())));
            *reply.status_mut() = StatusCode::OK;
            reply
        }
        JOIN_V2_PATH if release != Release::This => answer(404, None),
        JOIN_PATH | JOIN_V2_PATH => {
            if path == JOIN_PATH {
                let _: JoinRequest = serde_json::from_slice(body).expect("a JoinRequest");
            } else {
                let _: JoinRequestV2 = serde_json::from_slice(body).expect("a JoinRequestV2");
            }
            let n = counter.fetch_add(1, Ordering::SeqCst) as usize;
            let (status, retry_after) = script[n.min(script.len() - 1)];
            answer(status, retry_after)
        }
        _ => answer(404, None),
    }
}

fn answer(status: u16, retry_after: Option<&str>) -> Response<Full<Bytes>> {
    let body = if status == 200 {
        serde_json::to_vec(&join_response()).unwrap()
    } else {
        br#"{"error":"no","requestId":"req-1"}"#.to_vec()
    };
    let mut builder = Response::builder().status(StatusCode::from_u16(status).unwrap());
    if let Some(after) = retry_after {
        builder = builder.header("retry-after", after);
    }
    builder.body(Full::new(Bytes::from(body))).unwrap()
}

fn join_response() -> JoinResponse {
    JoinResponse {
        node_name: "ip-10-0-0-1.ec2.internal".into(),
        api_server: "https://10.0.0.2:6443".into(),
        cluster_ca: "ca".into(),
        client_certificate: "c".into(),
        serving_certificate: "s".into(),
        kubelet: KubeletSettings {
            config: serde_json::json!({"kind": "KubeletConfiguration"}),
            provider_id: "aws:///us-west-2a/i-0123456789abcdef0".into(),
            node_ip: "10.0.0.1".into(),
            register_with_taints: vec!["karpenter.sh/unregistered:NoExecute".into()],
            node_labels: Default::default(),
        },
        ignition: serde_json::json!({"ignition": {"version": "3.4.0"}}),
    }
}

/// An attester on a machine without NitroTPM (no tool).
fn no_tpm() -> Attester<'static> {
    static TPM: std::sync::OnceLock<NitroTpm> = std::sync::OnceLock::new();
    Attester {
        tpm: TPM.get_or_init(|| NitroTpm::at("/nonexistent/nitro-tpm-attest".into())),
        keys_digest: [0; 32],
    }
}

fn request() -> JoinRequest {
    JoinRequest {
        identity: InstanceIdentity {
            rsa2048: "sig".into(),
        },
        client_csr: "csr".into(),
        serving_csr: "csr".into(),
        agent_version: "test".into(),
    }
}

fn client(url: &str, trust: ServerTrust) -> ServerClient {
    let config = Config {
        server_url: url.parse().unwrap(),
        server_trust: trust,
        cluster_name: "c".into(),
        deadline: Duration::from_secs(60),
        state_dir: "/tmp".into(),
        proxy: Default::default(),
        imds_endpoint_mode: None,
    };
    ServerClient::new(&config, Clock::SYSTEM).unwrap()
}

fn pin(pki: &Pki) -> ServerTrust {
    ServerTrust::Sha256Pin(sha2::Sha256::digest(&pki.ca_der).into())
}

#[tokio::test]
async fn joins_with_a_pinned_ca_and_with_an_inline_ca() {
    let pki = pki();
    let (url, _) = serve(&pki, vec![(200, None)]).await;
    let deadline = Deadline::after(Duration::from_secs(20));
    let answer = client(&url, pin(&pki))
        .join(&request(), &no_tpm(), &deadline, |_| {})
        .await
        .unwrap();
    assert_eq!(answer, join_response());
    let answer = client(&url, ServerTrust::Ca(vec![pki.ca_der.clone()]))
        .join(&request(), &no_tpm(), &deadline, |_| {})
        .await
        .unwrap();
    assert_eq!(answer.node_name, "ip-10-0-0-1.ec2.internal");
}

#[tokio::test]
async fn transient_failures_are_retried_honouring_retry_after() {
    let pki = pki();
    let (url, count) = serve(&pki, vec![(503, None), (429, Some("2")), (200, None)]).await;
    let started = Instant::now();
    let answer = client(&url, pin(&pki))
        .join(
            &request(),
            &no_tpm(),
            &Deadline::after(Duration::from_secs(30)),
            |_| {},
        )
        .await;
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!(count.load(Ordering::SeqCst), 3);
    assert!(started.elapsed() >= Duration::from_secs(2));
}

#[tokio::test]
async fn refusals_are_final() {
    let pki = pki();
    let (url, count) = serve(&pki, vec![(403, None), (200, None)]).await;
    let err = client(&url, pin(&pki))
        .join(
            &request(),
            &no_tpm(),
            &Deadline::after(Duration::from_secs(30)),
            |_| {},
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, JoinError::Refused { status: 403, request_id, .. } if request_id == "req-1"),
        "{err}"
    );
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_server_without_the_pinned_ca_is_never_trusted() {
    let pki = pki();
    let other = self::pki();
    let (url, count) = serve(&pki, vec![(200, None)]).await;
    let err = client(&url, pin(&other))
        .join(
            &request(),
            &no_tpm(),
            &Deadline::after(Duration::from_secs(3)),
            |_| {},
        )
        .await
        .unwrap_err();
    assert!(matches!(err, JoinError::GaveUp { .. }), "{err}");
    assert!(err.to_string().contains("server-ca-sha256"), "{err}");
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "no request may reach an untrusted server"
    );
}

#[tokio::test]
async fn a_server_of_this_release_is_challenged_and_joined_through_v2_with_the_evidence() {
    let pki = pki();
    let (url, count, seen) = serve_as(&pki, vec![(503, None), (200, None)], Release::This).await;
    let deadline = Deadline::after(Duration::from_secs(20));
    let answer = client(&url, pin(&pki))
        .join(&request(), &no_tpm(), &deadline, |_| {})
        .await;
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!(count.load(Ordering::SeqCst), 2);
    let seen = seen.lock().unwrap().clone();
    let paths: Vec<&str> = seen.iter().map(|(p, ..)| p.as_str()).collect();
    // Each attempt asks for a fresh challenge: a nonce is good once.
    assert_eq!(
        paths,
        [CHALLENGE_PATH, JOIN_V2_PATH, CHALLENGE_PATH, JOIN_V2_PATH]
    );
    let reason = seen[1].1["attestation"]["unavailable"]["reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("/nonexistent/nitro-tpm-attest"), "{reason}");
}

#[tokio::test]
async fn a_server_of_before_the_challenge_is_joined_through_v1_and_asked_again_next_time() {
    let pki = pki();
    let (url, count, seen) = serve_as(&pki, vec![(503, None), (200, None)], Release::Before).await;
    let deadline = Deadline::after(Duration::from_secs(20));
    let answer = client(&url, pin(&pki))
        .join(&request(), &no_tpm(), &deadline, |_| {})
        .await;
    assert_eq!(answer.unwrap(), join_response());
    assert_eq!(count.load(Ordering::SeqCst), 2);
    let seen = seen.lock().unwrap().clone();
    let paths: Vec<&str> = seen.iter().map(|(p, ..)| p.as_str()).collect();
    // Asked again: the next try may reach a replica of this release.
    assert_eq!(
        paths,
        [CHALLENGE_PATH, JOIN_PATH, CHALLENGE_PATH, JOIN_PATH]
    );
    assert_eq!(
        seen[1].1,
        serde_json::to_value(request()).unwrap(),
        "the /v1 request as before"
    );
}

/// During a rolling upgrade the challenge may come from a replica of this
/// release and the join reach an older one: the same attempt then joins
/// through `/v1` rather than giving up on the 404.
#[tokio::test]
async fn a_v2_join_answered_404_by_an_older_replica_joins_through_v1_in_the_same_attempt() {
    let pki = pki();
    let (url, count, seen) = serve_as(&pki, vec![(200, None)], Release::Rolling).await;
    let deadline = Deadline::after(Duration::from_secs(20));
    let answer = client(&url, pin(&pki))
        .join(&request(), &no_tpm(), &deadline, |_| {})
        .await;
    assert_eq!(answer.unwrap(), join_response());
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "one join counted: the /v1 one"
    );
    let seen = seen.lock().unwrap().clone();
    let paths: Vec<&str> = seen.iter().map(|(p, ..)| p.as_str()).collect();
    assert_eq!(paths, [CHALLENGE_PATH, JOIN_V2_PATH, JOIN_PATH]);
}

/// Every request says how long the agent will keep trying: what is left
/// of its deadline, in whole seconds, so a busy server can tell it a turn
/// that far off.
#[tokio::test]
async fn every_request_says_how_long_the_agent_keeps_trying() {
    let pki = pki();
    let (url, _, seen) = serve_as(&pki, vec![(503, Some("1")), (200, None)], Release::This).await;
    let deadline = Deadline::after(Duration::from_secs(300));
    client(&url, pin(&pki))
        .join(&request(), &no_tpm(), &deadline, |_| {})
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "challenge, join, challenge, join");
    for (path, _, patience) in &seen {
        let seconds: u64 = patience
            .as_deref()
            .unwrap_or_else(|| panic!("{path} without patience"))
            .parse()
            .unwrap();
        assert!((290..300).contains(&seconds), "{path}: {seconds}");
    }
}
