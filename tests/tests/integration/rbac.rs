//! The guest-cluster RBAC, split by feature (`packaging/guest/`): for each
//! setting of the flags that changes it, the server starts and turns ready
//! under exactly the files those flags call for, and its ServiceAccount is
//! refused what they do not grant. Every probe is a dry run (authorized
//! like the real request, written nowhere), so a probe that got through
//! changes nothing; a 404 also means it got past authorization, which the
//! API server decides before it looks the object up.

use anyhow::{bail, ensure, Context, Result};
use autonode_shared::csr::{self, Purpose};
use autonode_tests::callers::joiner::CsrShape;
use autonode_tests::cloud::fakecloud::ec2::Ec2;
use autonode_tests::cloud::fakecloud::FakeCloud;
use autonode_tests::karpenter::standin;
use autonode_tests::kube::controlplane::ControlPlane;
use autonode_tests::kube::manifest::documents;
use autonode_tests::server::world::{cloud_settings, World, REGION};
use autonode_tests::server::{
    http_get, nodeclass_admission_settings, service_account_token, GuestRbac, ServerToken, Setup,
    TestServer, GUEST_KUSTOMIZATION, GUEST_RBAC_FILES, NODECLASS_ADMISSION_FILE,
    SERVER_SERVICE_ACCOUNT, TOKEN_ANCHOR, TOKEN_FILE,
};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// What the API server made of a probe.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Past authorization (done, as a dry run, or not found).
    Allowed,
    /// 403.
    Refused,
}
use Verdict::{Allowed, Refused};

fn verdict<T>(what: &str, result: kube::Result<T>) -> Result<Verdict> {
    match result {
        Ok(_) => Ok(Allowed),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Refused),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Allowed),
        Err(e) => Err(e).with_context(|| format!("probe {what}")),
    }
}

fn dry_post() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

fn dry_patch() -> PatchParams {
    PatchParams {
        dry_run: true,
        ..PatchParams::default()
    }
}

/// The server's ServiceAccount (`server`) probing what an admin set up.
struct Probe {
    server: Client,
}

impl Probe {
    /// Objects to probe, made by `admin`: a NodeClaim and an EC2NodeClass
    /// named `probe`, and a kubelet serving CSR nobody approves.
    async fn new(admin: &Client, server: &TestServer) -> Result<Self> {
        standin::create_ec2nodeclass(admin, "probe", "probe").await?;
        standin::create_nodeclaim(admin, "probe", "probe").await?;
        let shape = CsrShape {
            common_name: "system:node:probe".into(),
            organisation: Some("system:nodes"),
            dns: vec!["probe".into()],
            ips: vec![],
        };
        let pem = shape.csr(&rcgen::KeyPair::generate()?)?;
        let object = CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some("probe".into()),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: csr::SERVING_SIGNER.into(),
                usages: Some(
                    csr::usages_for(Purpose::Serving)
                        .iter()
                        .map(|u| u.to_string())
                        .collect(),
                ),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        };
        Api::<CertificateSigningRequest>::all(admin.clone())
            .create(&PostParams::default(), &object)
            .await
            .context("creating CSR probe")?;
        Ok(Self {
            server: server.guest_client().await?,
        })
    }

    async fn delete_nodeclaim(&self) -> Result<Verdict> {
        let params = DeleteParams {
            dry_run: true,
            ..DeleteParams::default()
        };
        let result = standin::nodeclaims(&self.server)
            .delete("probe", &params)
            .await;
        verdict("NodeClaim delete", result)
    }

    async fn patch_nodeclass(&self) -> Result<Verdict> {
        let patch = json!({"metadata": {"labels": {"probe": "x"}}});
        let result = standin::ec2nodeclasses(&self.server)
            .patch("probe", &dry_patch(), &Patch::Merge(&patch))
            .await;
        verdict("EC2NodeClass patch", result)
    }

    async fn create_event(&self, namespace: &str) -> Result<Verdict> {
        let event: Event = serde_json::from_value(json!({
            "metadata": {"generateName": "probe.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": "probe",
            },
            "reason": "Probe", "message": "probe", "type": "Normal",
            "source": {"component": "autonode-server"},
        }))?;
        let result = Api::<Event>::namespaced(self.server.clone(), namespace)
            .create(&dry_post(), &event)
            .await;
        verdict(&format!("Event create in {namespace}"), result)
    }

    fn approval() -> Value {
        json!({"status": {"conditions": [{
            "type": "Approved", "status": "True", "reason": "Probe", "message": "probe",
        }]}})
    }

    /// PATCH of the approval subresource: how the server approves.
    async fn patch_approval(&self) -> Result<Verdict> {
        let result = Api::<CertificateSigningRequest>::all(self.server.clone())
            .patch_approval("probe", &dry_patch(), &Patch::Merge(&Self::approval()))
            .await;
        verdict("CSR approval patch", result)
    }

    /// PUT (update) of the approval subresource: never needed.
    async fn put_approval(&self) -> Result<Verdict> {
        let api = Api::<CertificateSigningRequest>::all(self.server.clone());
        let mut csr = api.get("probe").await?;
        csr.status = serde_json::from_value(Self::approval()["status"].clone())?;
        let request = kube::core::Request::new(api.resource_url()).replace_subresource(
            "approval",
            "probe",
            &dry_post(),
            serde_json::to_vec(&csr)?,
        )?;
        let result = self
            .server
            .request::<CertificateSigningRequest>(request)
            .await;
        verdict("CSR approval update", result)
    }

    async fn list_secrets(&self, namespace: &str) -> Result<Verdict> {
        let result = Api::<Secret>::namespaced(self.server.clone(), namespace)
            .list(&Default::default())
            .await;
        verdict(&format!("Secret list in {namespace}"), result)
    }

    async fn get_lease(&self, name: &str) -> Result<Verdict> {
        let result = Api::<Lease>::namespaced(self.server.clone(), SERVER_SERVICE_ACCOUNT.0)
            .get(name)
            .await;
        verdict(&format!("Lease get {name}"), result)
    }

    /// A replace (PUT) of ConfigMap `name` in the leader namespace: how
    /// the rollout guard writes its store.
    async fn update_configmap(&self, name: &str) -> Result<Verdict> {
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": SERVER_SERVICE_ACCOUNT.0},
        }))?;
        let result = Api::<ConfigMap>::namespaced(self.server.clone(), SERVER_SERVICE_ACCOUNT.0)
            .replace(name, &dry_post(), &map)
            .await;
        verdict(&format!("ConfigMap update {name}"), result)
    }

    /// A create of a ConfigMap in `namespace` (a create names no object).
    async fn create_configmap(&self, namespace: &str) -> Result<Verdict> {
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"generateName": "probe-", "namespace": namespace},
        }))?;
        let result = Api::<ConfigMap>::namespaced(self.server.clone(), namespace)
            .create(&dry_post(), &map)
            .await;
        verdict(&format!("ConfigMap create in {namespace}"), result)
    }

    async fn get_crd(&self, name: &str) -> Result<Verdict> {
        let result = Api::<CustomResourceDefinition>::all(self.server.clone())
            .get(name)
            .await;
        verdict(&format!("CRD get {name}"), result)
    }

    async fn create_crd(&self) -> Result<Verdict> {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "scope": "Cluster",
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }],
            },
        }))?;
        let result = Api::<CustomResourceDefinition>::all(self.server.clone())
            .create(&dry_post(), &crd)
            .await;
        verdict("CRD create", result)
    }

    /// What no file grants, whatever the flags.
    async fn assert_base_bounds(&self) -> Result<()> {
        assert_eq!(self.create_event("default").await?, Allowed);
        for namespace in [SERVER_SERVICE_ACCOUNT.0, "kube-system"] {
            assert_eq!(self.create_event(namespace).await?, Refused, "{namespace}");
        }
        assert_eq!(self.patch_approval().await?, Allowed);
        assert_eq!(self.put_approval().await?, Refused);
        assert_eq!(self.list_secrets(SERVER_SERVICE_ACCOUNT.0).await?, Allowed);
        assert_eq!(self.list_secrets("default").await?, Refused);
        assert_eq!(self.get_lease("autonode-server").await?, Allowed);
        assert_eq!(self.get_lease("someone-else").await?, Refused);
        // The rollout store alone, of the ConfigMaps: not the Ignition
        // ones beside it, which are root on every node.
        assert_eq!(self.update_configmap("autonode-ignition").await?, Refused);
        assert_eq!(self.create_configmap("default").await?, Refused);
        Ok(())
    }
}

/// A server with `flags` turns ready; its ServiceAccount gets what the
/// base grants and no more, and deleting a NodeClaim and patching an
/// EC2NodeClass meet `delete` and `patch`.
async fn writes_under(flags: &[&str], delete: Verdict, patch: Verdict) -> Result<()> {
    let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    let world = World::start_with(&flags).await?;
    let probe = Probe::new(&world.cp.admin().await?, &world.server).await?;
    probe.assert_base_bounds().await?;
    assert_eq!(probe.delete_nodeclaim().await?, delete, "{flags:?}");
    assert_eq!(probe.patch_nodeclass().await?, patch, "{flags:?}");
    // The rollout guard's store goes with the upkeep.
    let store = probe.update_configmap("autonode-rollout").await?;
    assert_eq!(store, patch, "{flags:?}");
    let namespace = SERVER_SERVICE_ACCOUNT.0;
    assert_eq!(probe.create_configmap(namespace).await?, patch, "{flags:?}");
    // Only --install-crds reaches CRDs.
    assert_eq!(probe.create_crd().await?, Refused);
    assert_eq!(probe.get_crd("nodeclaims.karpenter.sh").await?, Refused);
    Ok(())
}

#[tokio::test]
async fn the_defaults_grant_deletion_and_upkeep_and_nothing_around_them() -> Result<()> {
    writes_under(&[], Allowed, Allowed).await
}

#[tokio::test]
async fn without_deletion_a_nodeclaim_delete_is_refused() -> Result<()> {
    writes_under(&["--delete-failed-nodeclaims=false"], Refused, Allowed).await
}

#[tokio::test]
async fn without_upkeep_an_ec2nodeclass_patch_is_refused() -> Result<()> {
    writes_under(&["--manage-nodeclasses=false"], Allowed, Refused).await
}

#[tokio::test]
async fn with_neither_both_writes_are_refused() -> Result<()> {
    let flags = [
        "--delete-failed-nodeclaims=false",
        "--manage-nodeclasses=false",
    ];
    writes_under(&flags, Refused, Refused).await
}

/// A fake cloud and a server with `setup` on `cp` (dropped in that order:
/// the server first).
async fn server_on(cp: &ControlPlane, setup: &Setup<'_>) -> Result<(TestServer, Ec2, FakeCloud)> {
    let cloud = FakeCloud::new()?;
    let ec2 = cloud.start_ec2(REGION)?;
    let server = TestServer::launch(cp, &cloud_settings(&cloud, &ec2), setup).await?;
    Ok((server, ec2, cloud))
}

/// `--install-crds` into a cluster without Karpenter's CRDs: ready means
/// they are installed; any other CRD stays out of reach.
#[tokio::test]
async fn install_crds_reaches_karpenters_crds_only() -> Result<()> {
    let cp = ControlPlane::start_without_crds().await?;
    let flags = ["--install-crds".to_string()];
    let setup = Setup {
        extra_args: &flags,
        ..Setup::default()
    };
    let (server, _ec2, _cloud) = server_on(&cp, &setup).await?;
    let admin = cp.admin().await?;
    let probe = Probe::new(&admin, &server).await?;
    probe.assert_base_bounds().await?;
    assert_eq!(probe.get_crd("nodeclaims.karpenter.sh").await?, Allowed);
    assert_eq!(probe.get_crd("widgets.example.com").await?, Refused);
    assert_eq!(
        probe
            .get_crd("customresourcedefinitions.apiextensions.k8s.io")
            .await?,
        Refused
    );
    Ok(())
}

/// With `--ignition-secrets=false` the server never lists or watches
/// Secrets: it turns ready without rbac-ignition-secrets.yaml, and its
/// token can read no Secret. With Secrets on and that file left out, it
/// stays unready and says why.
#[tokio::test]
async fn without_the_secrets_file_only_a_server_told_so_turns_ready() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let off = Setup {
        extra_args: &["--ignition-secrets=false".into()],
        ..Setup::default()
    };
    let (server, _ec2, _cloud) = server_on(&cp, &off).await?;
    let (status, body) = http_get(&format!("{}/readyz", server.metrics_url())).await?;
    assert_eq!(status, 200, "{body}");
    let probe = Probe::new(&cp.admin().await?, &server).await?;
    assert_eq!(probe.list_secrets(SERVER_SERVICE_ACCOUNT.0).await?, Refused);
    drop(server);

    let on = Setup {
        wait_ready: false,
        rbac: Some(GuestRbac {
            ignition_secrets: false,
            ..GuestRbac::default()
        }),
        ..Setup::default()
    };
    let (server, _ec2, _cloud) = server_on(&cp, &on).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, body) = http_get(&format!("{}/readyz", server.metrics_url())).await?;
    assert_eq!(status, 503, "ready without reading Secrets: {body}");
    assert!(body.contains("Ignition Secret"), "{body}");
    Ok(())
}

fn guest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/guest")
}

/// Every rule of every (Cluster)Role in `docs`: (file, role kind, rule).
fn rules<'a>(files: &'a [(&'a str, Vec<Value>)]) -> Vec<(&'a str, &'a str, &'a Value)> {
    files
        .iter()
        .flat_map(|(file, docs)| {
            docs.iter()
                .filter(|d| matches!(d["kind"].as_str(), Some("Role" | "ClusterRole")))
                .flat_map(move |d| {
                    let kind = d["kind"].as_str().unwrap_or_default();
                    d["rules"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(move |r| (*file, kind, r))
                })
        })
        .collect()
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// The tree itself: every file parses, the harness knows every file,
/// `kustomization.yaml` lists the base and the default-on files (and names
/// the others), every binding binds the server's ServiceAccount to a role
/// of its own file, and the grants the review took away stay away.
#[test]
fn the_guest_rbac_tree_is_consistent() -> Result<()> {
    let dir = guest_dir();
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(&dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            on_disk.insert(name);
        }
    }
    let known: BTreeSet<String> = GUEST_RBAC_FILES
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    assert_eq!(on_disk, known, "tests/src/server/mod.rs GUEST_RBAC_FILES");

    let kustomization: Value = serde_yaml::from_str(GUEST_KUSTOMIZATION)?;
    assert_eq!(kustomization["kind"], "Kustomization");
    assert_eq!(
        strings(&kustomization["resources"]),
        GuestRbac::default().files(),
        "kustomization.yaml must list exactly what the default flags need"
    );
    for (name, _) in GUEST_RBAC_FILES {
        assert!(
            GUEST_KUSTOMIZATION.contains(&format!("- {name}")),
            "kustomization.yaml does not name {name}"
        );
    }

    let (namespace, account) = SERVER_SERVICE_ACCOUNT;
    let mut files = Vec::new();
    for (name, text) in GUEST_RBAC_FILES {
        let docs = documents(text).with_context(|| name.to_string())?;
        for doc in &docs {
            for field in ["apiVersion", "kind"] {
                ensure!(doc[field].is_string(), "{name}: a document without {field}");
            }
            ensure!(
                doc["metadata"]["name"].is_string(),
                "{name}: a document without a name"
            );
            let rbac = doc["apiVersion"] == "rbac.authorization.k8s.io/v1";
            if let Some(kind) = doc["kind"]
                .as_str()
                .filter(|k| rbac && k.ends_with("Binding"))
            {
                let subjects = doc["subjects"].as_array().context("subjects")?;
                assert_eq!(
                    subjects,
                    &[json!({"kind": "ServiceAccount", "name": account, "namespace": namespace})],
                    "{name}: {kind} binds only the server"
                );
                let role = &doc["roleRef"];
                let defined = docs.iter().any(|d| {
                    d["kind"] == role["kind"]
                        && d["metadata"]["name"] == role["name"]
                        && d["metadata"]["namespace"] == doc["metadata"]["namespace"]
                });
                ensure!(defined, "{name}: {kind} names a role not in the file");
            }
        }
        files.push((name, docs));
    }

    let mut seen_secrets = false;
    for (file, kind, rule) in rules(&files) {
        let (resources, verbs) = (strings(&rule["resources"]), strings(&rule["verbs"]));
        let has = |r: &str| resources.contains(&r);
        ensure!(
            !resources.contains(&"*") && !verbs.contains(&"*"),
            "{file}: a wildcard"
        );
        if has("certificatesigningrequests/approval") {
            assert_eq!(verbs, ["patch"], "{file}: approval is a patch, only");
        }
        if has("events") {
            assert_eq!(kind, "Role", "{file}: Events only in a namespace");
        }
        if has("secrets") {
            seen_secrets = true;
            assert_eq!(file, "rbac-ignition-secrets.yaml", "Secrets only there");
        }
        let owner = match () {
            _ if has("nodeclaims") && verbs.contains(&"delete") => "rbac-delete-nodeclaims.yaml",
            _ if has("ec2nodeclasses") && verbs.contains(&"patch") => {
                "rbac-manage-nodeclasses.yaml"
            }
            _ if has("customresourcedefinitions") => "rbac-install-crds.yaml",
            _ if has("configmaps")
                && verbs
                    .iter()
                    .any(|v| v != &"get" && v != &"list" && v != &"watch") =>
            {
                "rbac-manage-nodeclasses.yaml"
            }
            _ => file,
        };
        assert_eq!(file, owner, "{resources:?} {verbs:?} belong in {owner}");
    }
    ensure!(seen_secrets, "no file grants the Ignition Secrets");
    for (file, docs) in &files {
        for doc in docs {
            if doc["kind"] == "Role" || doc["kind"] == "RoleBinding" {
                let ns = doc["metadata"]["namespace"].as_str().unwrap_or_default();
                if !["default", namespace].contains(&ns) {
                    bail!("{file}: a Role outside default and {namespace}: {ns}");
                }
            }
        }
    }
    Ok(())
}

/// The admission policy's file: it spares exactly the server's
/// ServiceAccount, denies, reads its settings from beside that account, and
/// ships the settings of the server's default flags.
#[test]
fn the_admission_policy_spares_the_server_alone() -> Result<()> {
    let text = GUEST_RBAC_FILES
        .iter()
        .find(|(name, _)| *name == NODECLASS_ADMISSION_FILE)
        .map(|(_, text)| *text)
        .context("no admission file")?;
    let docs = documents(text)?;
    let of = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .with_context(|| format!("no {kind}"))
    };
    let (namespace, account) = SERVER_SERVICE_ACCOUNT;
    let policy = of("ValidatingAdmissionPolicy")?;
    let spares =
        format!("request.userInfo.username != 'system:serviceaccount:{namespace}:{account}'");
    assert_eq!(
        policy["spec"]["matchConditions"],
        json!([{"name": "not-autonode-server", "expression": spares}])
    );
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    let binding = of("ValidatingAdmissionPolicyBinding")?;
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    let settings = of("ConfigMap")?;
    let param = &binding["spec"]["paramRef"];
    assert_eq!(param["name"], settings["metadata"]["name"]);
    assert_eq!(param["namespace"], namespace);
    assert_eq!(param["parameterNotFoundAction"], "Deny");
    assert_eq!(settings["metadata"]["namespace"], namespace);
    assert_eq!(settings["data"], nodeclass_admission_settings(&[]));
    Ok(())
}

#[test]
fn the_flags_pick_the_files() {
    let pick = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        GuestRbac::for_flags(&args).files()
    };
    let base = ["rbac.yaml", "rbac-ignition-secrets.yaml"];
    let manage = ["rbac-manage-nodeclasses.yaml", NODECLASS_ADMISSION_FILE];
    assert_eq!(
        pick(&[]),
        [&base[..], &["rbac-delete-nodeclaims.yaml"], &manage].concat()
    );
    assert_eq!(
        pick(&[
            "--delete-failed-nodeclaims",
            "false",
            "--manage-nodeclasses=false"
        ]),
        base
    );
    assert_eq!(
        pick(&["--manage-nodeclasses=false", "--install-crds"]),
        [
            &base[..],
            &["rbac-delete-nodeclaims.yaml", "rbac-install-crds.yaml"]
        ]
        .concat()
    );
    assert_eq!(
        pick(&[
            "--install-crds",
            "--delete-failed-nodeclaims=false",
            "--install-crds=false"
        ]),
        [&base[..], &manage].concat()
    );
}

/// The documented token path (docs/rbac.md, *The server's kubeconfig*):
/// the kubeconfig names a token file, renewed from the control plane's
/// side. The server keeps working once its first token is revoked, after
/// the file was given a new one: it reads the file again.
#[tokio::test]
async fn a_server_reads_its_renewed_token_from_its_token_file() -> Result<()> {
    let setup = Setup {
        token: ServerToken::File,
        ..Setup::default()
    };
    let world = World::start_setup(&setup).await?;
    world.join_new(|i| i).await?;
    let admin = world.cp.admin().await?;
    let renewed = service_account_token(&admin, SERVER_SERVICE_ACCOUNT, None).await?;
    std::fs::write(world.server.dir().join(TOKEN_FILE), renewed)?;
    // The file is read again at least once a minute.
    tokio::time::sleep(Duration::from_secs(65)).await;
    let anchors: Api<Secret> = Api::namespaced(admin, SERVER_SERVICE_ACCOUNT.0);
    anchors
        .delete(TOKEN_ANCHOR, &DeleteParams::default())
        .await?;
    // Past the API server's cache of authenticated tokens (10 s).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let joined = world.join_new(|i| i).await?;
    assert_eq!(joined.response.node_name, joined.instance.private_dns_name);
    Ok(())
}

/// The code block of `doc` that begins with the line `first`.
fn doc_block(doc: &str, first: &str) -> Result<String> {
    doc.split_once(first)
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .map(|(block, _)| format!("{first}{block}"))
        .with_context(|| format!("docs/rbac.md: no block beginning {first:?}"))
}

/// docs/rbac.md's commands that build the server's kubeconfig and renew
/// its token (*The server's kubeconfig*), run as written against a real
/// API server (its admin kubeconfig for `--context guest` and for the
/// hosted control plane's cluster, its URL for the placeholder), with the
/// project's kubectl: the kubeconfig they make authenticates as the
/// server's ServiceAccount through the token file, granted what the guest
/// RBAC grants and nothing else, and no token is left in a guest Secret.
#[tokio::test]
async fn the_rbac_docs_kubeconfig_commands_make_the_servers_kubeconfig() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let client = cp.admin().await?;
    GuestRbac::default().apply(&client, cp.version()).await?;
    let hosted = "hosted-control-plane";
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": hosted}});
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(namespace)?)
        .await?;
    let doc = std::fs::read_to_string(guest_dir().join("../../docs/rbac.md"))?;
    let kubeconfig_block = doc_block(&doc, "TOKEN_FILE=")?;
    let renewal = doc_block(
        &doc,
        "kubectl --context guest -n autonode-system create token",
    )?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("guest.kubeconfig");
    let token_file = dir.path().join("token");
    let script = format!("{kubeconfig_block}\n{renewal}")
        .replace(
            "TOKEN_FILE=/var/run/secrets/autonode/guest-token/token",
            &format!("TOKEN_FILE={}", token_file.display()),
        )
        .replace("--context guest ", "")
        .replace("HOSTED-CONTROL-PLANE-NAMESPACE", hosted)
        .replace("https://API-SERVER:6443", cp.url());
    let kube = autonode_tests::kube::controlplane::kube_bin_dir()?;
    let path = format!("{}:{}", kube.display(), std::env::var("PATH")?);
    let out = std::process::Command::new("timeout")
        .args(["60", "bash", "-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", &path)
        .env("HOME", dir.path())
        .env("KUBECONFIG", cp.admin_kubeconfig())
        .output()?;
    ensure!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The renewed token is in the hosted control plane's namespace only.
    let stored = Api::<Secret>::namespaced(client.clone(), hosted)
        .get("autonode-guest-token")
        .await?;
    let token = stored.data.unwrap_or_default();
    ensure!(
        token.get("token").map(|t| t.0.clone()) == Some(std::fs::read(&token_file)?),
        "the Secret does not hold the token the kubeconfig reads"
    );
    let guest: Api<Secret> = Api::namespaced(client, SERVER_SERVICE_ACCOUNT.0);
    let left = guest.list(&Default::default()).await?.items;
    ensure!(
        left.is_empty(),
        "Secrets in the guest's {}: {left:?}",
        SERVER_SERVICE_ACCOUNT.0
    );
    let can_i = |verb: &str, resource: &str| -> Result<bool> {
        let kubeconfig = kubeconfig.to_string_lossy();
        let args = ["auth", "can-i", verb, resource];
        let out = std::process::Command::new(kube.join("kubectl"))
            .arg(format!("--kubeconfig={kubeconfig}"))
            .args(args)
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim() == "yes")
    };
    ensure!(
        can_i("patch", "nodeclaims.karpenter.sh")?,
        "the kubeconfig is not the server's"
    );
    ensure!(
        !can_i("delete", "nodes")?,
        "the kubeconfig has more than the guest RBAC"
    );
    Ok(())
}
