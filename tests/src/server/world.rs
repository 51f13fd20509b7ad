//! One test's world: a control plane, a fake cloud, and autonode-server,
//! with helpers that play Karpenter's part and check outcomes.

use crate::callers::joiner::{honest_request, Answer, Joiner, NodeKeys};
use crate::cloud::fakecloud::ec2::Ec2;
use crate::cloud::fakecloud::{FakeCloud, Instance};
use crate::harness::pki::CertPair;
use crate::harness::poll;
use crate::karpenter::standin;
use crate::kube::controlplane::{unique, ControlPlane};
use crate::kube::events;
use crate::server::{CloudSettings, Setup, TestServer};
use anyhow::{Context, Result};
use autonode_shared::protocol::JoinResponse;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, ListParams};
use kube::Client;
use std::net::IpAddr;
use std::time::Duration;

pub const ACCOUNT: &str = "123456789012";
pub const REGION: &str = "us-west-2";

/// A customiser for [`World::launch`]: the instance in `region`, zone
/// `<region>a` (a region the World's server does not allow, unless it is
/// [`REGION`]).
pub fn in_region(region: &'static str) -> impl FnOnce(Instance) -> Instance {
    move |i| Instance {
        region: region.into(),
        availability_zone: format!("{region}a"),
        ..i
    }
}

/// What a server is told about `cloud` and its `ec2`: the test account and
/// region allowed.
pub fn cloud_settings(cloud: &FakeCloud, ec2: &Ec2) -> CloudSettings {
    CloudSettings {
        identity_ca_pem: cloud.ca().ca_pem(),
        ec2_endpoint: ec2.url(),
        accounts: vec![ACCOUNT.into()],
        regions: vec![REGION.into()],
    }
}

/// A control plane, a fake cloud and a server, shared by one test's cases.
// Field order is drop order: the server stops before the control plane.
pub struct World {
    pub joiner: Joiner,
    pub server: TestServer,
    pub ec2: Ec2,
    pub cloud: FakeCloud,
    pub cp: ControlPlane,
}

impl World {
    /// A second server on this world's control plane, started with `args`,
    /// and a joiner for it. The servers share a service account: the RBAC
    /// of the later one (as its flags ask) replaces the earlier one's.
    pub async fn second_server(&self, args: &[String]) -> Result<(TestServer, Joiner)> {
        let settings = cloud_settings(&self.cloud, &self.ec2);
        let server = TestServer::start(&self.cp, &settings, args).await?;
        let joiner = Joiner::new(server.url(), server.ca_pem())?;
        Ok((server, joiner))
    }

    pub async fn start() -> Result<Self> {
        Self::start_with(&[]).await
    }

    /// Like [`World::start`], with extra `autonode-server serve` flags.
    pub async fn start_with(server_args: &[String]) -> Result<Self> {
        Self::start_reachable_at(&[], server_args).await
    }

    /// Like [`World::start_with`], with the API server's and the server's
    /// certificates also valid for `extra_ips`: where machines that are
    /// not this host (VMs) reach them through forwards.
    pub async fn start_reachable_at(extra_ips: &[IpAddr], server_args: &[String]) -> Result<Self> {
        let setup = Setup {
            extra_args: server_args,
            extra_ips,
            ..Setup::default()
        };
        Self::start_setup(&setup).await
    }

    /// A world whose server is started as `setup` says.
    pub async fn start_setup(setup: &Setup<'_>) -> Result<Self> {
        let cp = ControlPlane::start_reachable_at(setup.extra_ips).await?;
        let cloud = FakeCloud::new()?;
        let ec2 = cloud.start_ec2(REGION)?;
        let settings = cloud_settings(&cloud, &ec2);
        let server = TestServer::launch(&cp, &settings, setup).await?;
        let joiner = Joiner::new(server.url(), server.ca_pem())?;
        Ok(Self {
            cp,
            cloud,
            ec2,
            server,
            joiner,
        })
    }

    /// Karpenter's part: a NodeClaim, then the instance, then its providerID.
    pub async fn launch(
        &self,
        customise: impl FnOnce(Instance) -> Instance,
    ) -> Result<(String, Instance)> {
        self.launch_annotated(serde_json::json!({}), customise)
            .await
    }

    /// Like [`World::launch`], with the NodeClaim carrying `annotations`
    /// as Karpenter copies them from a NodePool's template.
    pub async fn launch_annotated(
        &self,
        annotations: serde_json::Value,
        customise: impl FnOnce(Instance) -> Instance,
    ) -> Result<(String, Instance)> {
        self.launch_in("default", annotations, customise).await
    }

    /// Like [`World::launch_annotated`], from the EC2NodeClass `class`.
    pub async fn launch_in(
        &self,
        class: &str,
        annotations: serde_json::Value,
        customise: impl FnOnce(Instance) -> Instance,
    ) -> Result<(String, Instance)> {
        let admin = self.cp.admin().await?;
        let claim = format!("{class}-{}", unique());
        standin::create_nodeclaim_annotated(&admin, &claim, class, annotations).await?;
        let built = Instance::builder()
            .account_id(ACCOUNT)
            .region(REGION)
            .build();
        let instance = self.cloud.launch(customise(built));
        standin::set_provider_id(&admin, &claim, &instance.provider_id()).await?;
        Ok((claim, instance))
    }

    /// Karpenter's part and an honest agent's: a launched instance joined
    /// with fresh keys, and a client speaking with the node credential it
    /// got (what an attacker holding one honest node has).
    pub async fn join_new(
        &self,
        customise: impl FnOnce(Instance) -> Instance,
    ) -> Result<JoinedNode> {
        let (claim, instance) = self.launch(customise).await?;
        let keys = NodeKeys::generate()?;
        let response = self
            .joiner
            .join(&honest_request(&instance, self.cloud.ca(), &keys)?)
            .await?
            .granted();
        let client = self.node_client(&response, &keys).await?;
        Ok(JoinedNode {
            claim,
            instance,
            keys,
            response,
            client,
        })
    }

    /// A client with the node credential `response` issued for `keys`.
    pub async fn node_client(&self, response: &JoinResponse, keys: &NodeKeys) -> Result<Client> {
        self.cp
            .client_with_cert(&CertPair {
                cert_pem: response.client_certificate.clone(),
                key_pem: keys.client.serialize_pem(),
            })
            .await
    }

    /// CSRs autonode created for this instance.
    pub async fn csrs_for(&self, instance: &Instance) -> Result<Vec<CertificateSigningRequest>> {
        let api: Api<CertificateSigningRequest> = Api::all(self.cp.admin().await?);
        let selector = format!("autonode.dev/instance-id={}", instance.instance_id);
        Ok(api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items)
    }

    /// Asserts a refusal: 403, nothing created or approved for the
    /// instance, and the precise reason logged against the request id.
    pub async fn assert_refused(
        &self,
        answer: Answer,
        instance: &Instance,
        reason: &str,
    ) -> Result<()> {
        let Answer::Refused(status, body) = answer else {
            panic!("expected a refusal for {reason}, the join was granted");
        };
        assert_eq!(status, 403, "{reason}: {body:?}");
        assert_eq!(
            body.error, "join refused",
            "the caller learns nothing precise"
        );
        assert!(
            self.csrs_for(instance).await?.is_empty(),
            "{reason}: a CSR exists"
        );
        let log = self.server.log();
        let line = log
            .lines()
            .find(|l| l.contains(&body.request_id) && l.contains("join refused"))
            .with_context(|| format!("no log line for request {}", body.request_id))?;
        assert!(line.contains(reason), "expected reason {reason} in: {line}");
        Ok(())
    }

    /// The reasons of the Events on the cluster-scoped object named `claim`
    /// (a NodeClaim, a CSR), once one with `awaited` has arrived (Events
    /// are published in the background).
    pub async fn event_reasons(&self, claim: &str, awaited: &str) -> Result<Vec<String>> {
        let admin = self.cp.admin().await?;
        poll::until(
            &format!("{awaited} Event on {claim}"),
            Duration::from_secs(10),
            Duration::from_millis(100),
            || async {
                let reasons = events::event_reasons(&admin, claim).await?;
                Ok(reasons.iter().any(|r| r == awaited).then_some(reasons))
            },
        )
        .await
    }
}

/// A machine that joined: its NodeClaim, instance, keys, the join's answer
/// and a client with its node credential.
pub struct JoinedNode {
    pub claim: String,
    pub instance: Instance,
    pub keys: NodeKeys,
    pub response: JoinResponse,
    pub client: Client,
}
