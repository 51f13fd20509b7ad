//! Speaks the join protocol directly, as an agent would, for tests that
//! need requests an honest agent never makes (a wrong CN, a foreign SAN, a
//! replayed document) and for load tests that want a thousand joins without
//! a thousand processes.

use crate::cloud::fakecloud::signer::TestCa;
use crate::cloud::fakecloud::Instance;
use anyhow::{Context, Result};
use autonode_shared::protocol::{
    ChallengeRequest, ChallengeResponse, ErrorResponse, InstanceIdentity, JoinRequest,
    JoinRequestV2, JoinResponse, CHALLENGE_PATH, JOIN_PATH, JOIN_V2_PATH,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use std::net::IpAddr;

/// The HTTPS connector the join clients use.
pub type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// A TLS client config that trusts only `ca_pem` (what an agent pins).
pub fn tls_config(ca_pem: &str) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    Ok(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// An HTTPS client trusting only `ca_pem`, one connection per request as
/// the agent makes them: a pooled connection the server has closed (after
/// a 413, a restart) would fail the next request for reasons no agent meets.
pub fn https_client(ca_pem: &str) -> Result<Client<Https, Full<Bytes>>> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config(ca_pem)?)
        .https_only()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(https))
}

/// An HTTPS client that trusts only the server's CA.
#[derive(Clone)]
pub struct Joiner {
    client: Client<Https, Full<Bytes>>,
    base: String,
}

/// A join's answer: granted, or refused with a status and body.
#[derive(Debug)]
pub enum Answer {
    Granted(Box<JoinResponse>),
    Refused(u16, ErrorResponse),
}

impl Answer {
    /// The response of a granted join, or a panic naming the refusal.
    pub fn granted(self) -> JoinResponse {
        match self {
            Answer::Granted(r) => *r,
            Answer::Refused(code, body) => panic!("join refused: {code} {body:?}"),
        }
    }

    /// The HTTP status (200 when granted).
    pub fn status(&self) -> u16 {
        match self {
            Answer::Granted(_) => 200,
            Answer::Refused(code, _) => *code,
        }
    }
}

impl Joiner {
    pub fn new(base_url: &str, ca_pem: &str) -> Result<Self> {
        Ok(Self {
            client: https_client(ca_pem)?,
            base: base_url.trim_end_matches('/').to_string(),
        })
    }

    /// POSTs raw bytes to `path`: (status, body).
    pub async fn post(&self, path: &str, body: Vec<u8>) -> Result<(u16, Bytes)> {
        let request = hyper::Request::post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let response = self
            .client
            .request(request)
            .await
            .context("join API request")?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    /// Sends a join request.
    pub async fn join(&self, request: &JoinRequest) -> Result<Answer> {
        self.answer(JOIN_PATH, serde_json::to_vec(request)?).await
    }

    /// Sends a `/v2` join request (with attestation evidence).
    pub async fn join_v2(&self, request: &JoinRequestV2) -> Result<Answer> {
        self.answer(JOIN_V2_PATH, serde_json::to_vec(request)?)
            .await
    }

    /// Asks for a challenge: the nonce's bytes.
    pub async fn challenge(&self) -> Result<Vec<u8>> {
        let asked = ChallengeRequest {
            agent_version: "test".into(),
        };
        let (status, body) = self
            .post(CHALLENGE_PATH, serde_json::to_vec(&asked)?)
            .await?;
        anyhow::ensure!(
            status == 200,
            "challenge: {status} {}",
            String::from_utf8_lossy(&body)
        );
        let challenge: ChallengeResponse = serde_json::from_slice(&body)?;
        use base64::Engine;
        Ok(base64::engine::general_purpose::STANDARD.decode(challenge.nonce)?)
    }

    async fn answer(&self, path: &str, request: Vec<u8>) -> Result<Answer> {
        let (status, body) = self.post(path, request).await?;
        if status == 200 {
            return Ok(Answer::Granted(Box::new(serde_json::from_slice(&body)?)));
        }
        let error = serde_json::from_slice(&body).with_context(|| {
            format!(
                "status {status} with body {}",
                String::from_utf8_lossy(&body)
            )
        })?;
        Ok(Answer::Refused(status, error))
    }
}

/// A node's two key pairs, as the agent would generate them.
pub struct NodeKeys {
    pub client: KeyPair,
    pub serving: KeyPair,
}

impl NodeKeys {
    pub fn generate() -> Result<Self> {
        Ok(Self {
            client: KeyPair::generate()?,
            serving: KeyPair::generate()?,
        })
    }
}

/// The subject and SANs to put in a CSR.
pub struct CsrShape<'a> {
    pub common_name: String,
    pub organisation: Option<&'a str>,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl CsrShape<'_> {
    /// What an honest agent asks for its client certificate.
    pub fn client(node_name: &str) -> Self {
        Self {
            common_name: format!("system:node:{node_name}"),
            organisation: Some("system:nodes"),
            dns: vec![],
            ips: vec![],
        }
    }

    /// What an honest agent asks for its serving certificate.
    pub fn serving(instance: &Instance) -> Self {
        Self {
            common_name: format!("system:node:{}", instance.private_dns_name),
            organisation: Some("system:nodes"),
            dns: vec![instance.private_dns_name.clone()],
            ips: vec![IpAddr::V4(instance.private_ip)],
        }
    }

    /// A PEM CSR of this shape signed by `key`.
    pub fn csr(&self, key: &KeyPair) -> Result<String> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, self.common_name.clone());
        if let Some(org) = self.organisation {
            dn.push(DnType::OrganizationName, org);
        }
        params.distinguished_name = dn;
        params.subject_alt_names = self
            .dns
            .iter()
            .map(|d| Ok(SanType::DnsName(d.clone().try_into()?)))
            .chain(self.ips.iter().map(|ip| Ok(SanType::IpAddress(*ip))))
            .collect::<Result<_, rcgen::Error>>()?;
        Ok(params.serialize_request(key)?.pem()?)
    }
}

/// The instance's signed identity, as IMDS would serve it.
pub fn identity(instance: &Instance, ca: &TestCa) -> Result<InstanceIdentity> {
    let document = instance.identity_document();
    let rsa2048 = ca.rsa2048(document.as_bytes(), time::OffsetDateTime::now_utc())?;
    Ok(InstanceIdentity { rsa2048 })
}

/// The request an honest agent on `instance` makes.
pub fn honest_request(instance: &Instance, ca: &TestCa, keys: &NodeKeys) -> Result<JoinRequest> {
    Ok(JoinRequest {
        identity: identity(instance, ca)?,
        client_csr: CsrShape::client(&instance.private_dns_name).csr(&keys.client)?,
        serving_csr: CsrShape::serving(instance).csr(&keys.serving)?,
        agent_version: "test".into(),
    })
}
