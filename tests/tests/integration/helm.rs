//! The Helm chart (`packaging/helm/autonode-server`), rendered by the real
//! helm (`tests/setup/install-helm`): it lints strictly and packages; every
//! `serve` flag is a value at the flag's default; each option renders what
//! it says; what it renders passes a real kube-apiserver's server-side dry
//! run (the prometheus-operator kinds against minimal CRDs in
//! tests/crds/); it stays in step with the
//! Kustomize base and `packaging/guest`; and a real autonode-server runs
//! under the guest RBAC it renders.

use anyhow::{bail, ensure, Context, Result};
use autonode_tests::callers::joiner::Joiner;
use autonode_tests::cloud::fakecloud::FakeCloud;
use autonode_tests::karpenter::standin;
use autonode_tests::kube::controlplane::ControlPlane;
use autonode_tests::kube::manifest::documents;
use autonode_tests::kube::version::KubeVersion;
use autonode_tests::server::helm::{self, chart_dir, guest_rbac_manifest, only, template};
use autonode_tests::server::world::{cloud_settings, World, REGION};
use autonode_tests::server::{
    nodeclass_admission_settings, server_binary, GuestRbac, Setup, TestServer, GUEST_RBAC_FILES,
    NODECLASS_ADMISSION_SETTINGS,
};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{pinned_kind, Scope};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The namespace the management-cluster objects are rendered into.
const NAMESPACE: &str = "autonode-hcp";

/// One flag of `autonode-server serve --help`.
#[derive(Debug)]
struct Flag {
    env: Option<String>,
    default: Option<String>,
}

/// `autonode-server serve --help`, parsed: each long flag (but --help) with
/// its environment variable and default. Run with an empty environment, so
/// the help shows no value of the test's own.
fn serve_flags() -> Result<BTreeMap<String, Flag>> {
    let output = std::process::Command::new(server_binary()?)
        .args(["serve", "--help"])
        .env_clear()
        .output()?;
    ensure!(output.status.success(), "serve --help failed");
    let text = String::from_utf8(output.stdout)?;
    let mut flags = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    let mut finish = |(name, doc): (String, String)| {
        let between = |open: &str| {
            doc.find(open).map(|at| {
                let rest = &doc[at + open.len()..];
                rest[..rest.find(']').unwrap_or(rest.len())].to_string()
            })
        };
        let env = between("[env: ").map(|e| e.trim_end_matches('=').to_string());
        let default = between("[default: ");
        // --check-config is a mode of the command, not a setting.
        if name != "help" && name != "check-config" {
            flags.insert(name, Flag { env, default });
        }
    };
    for line in text.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed
            .strip_prefix("--")
            .or_else(|| trimmed.strip_prefix("-h, --"));
        match flag {
            // A flag's own line is indented 6 (or `-h, ` at 2); its
            // description 10.
            Some(rest) if line.len() - trimmed.len() <= 6 => {
                if let Some(done) = current.take() {
                    finish(done);
                }
                let name = rest.split_whitespace().next().unwrap_or_default();
                current = Some((name.to_string(), String::new()));
            }
            _ => {
                if let Some((_, doc)) = current.as_mut() {
                    doc.push(' ');
                    doc.push_str(trimmed);
                }
            }
        }
    }
    if let Some(done) = current.take() {
        finish(done);
    }
    ensure!(flags.len() > 30, "parsed too few flags: {flags:?}");
    Ok(flags)
}

/// The chart's values.yaml, parsed, and its text.
fn values() -> Result<(Value, String)> {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml"))?;
    Ok((serde_yaml::from_str(&text)?, text))
}

/// A value of `serve` as the flag takes it, the way the chart writes it
/// (lists joined with commas); None for null.
fn flag_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => Some(
            items
                .iter()
                .filter_map(flag_text)
                .collect::<Vec<_>>()
                .join(","),
        ),
        other => Some(other.to_string()),
    }
}

/// The default a hidden flag (absent from --help) has in the server's
/// source: the `default_value` of the `#[arg(...)]` naming it.
fn source_default(flag: &str) -> Result<String> {
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/src/cmd/config.rs"),
    )?;
    let at = source
        .find(&format!("long = \"{flag}\""))
        .with_context(|| format!("--{flag} not in server/src/cmd/config.rs"))?;
    let start = source[..at].rfind("#[arg(").context("no #[arg(")?;
    let end = at + source[at..].find(")]").context("no )]")?;
    let block = &source[start..end];
    let value = block
        .split("default_value = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .with_context(|| format!("--{flag} has no default_value"))?;
    Ok(value.to_string())
}

/// Every flag of `serve --help` is a key of `serve` in values.yaml, with a
/// comment above it, at the flag's own default (null or empty where the
/// flag has none); every other key is a flag the server accepts (hidden
/// from --help) at its default in the source. `instance-name` is the one
/// flag the chart sets otherwise: null, so that POD_NAME names the replica.
#[test]
fn every_serve_flag_is_a_value_at_its_default() -> Result<()> {
    let flags = serve_flags()?;
    let (values, text) = values()?;
    let serve = values["serve"].as_object().context("values.yaml: serve")?;
    let mut problems = Vec::new();
    for (name, flag) in &flags {
        let Some(value) = serve.get(name) else {
            problems.push(format!("--{name} has no value under serve"));
            continue;
        };
        let expected = match (name.as_str(), &flag.default) {
            ("instance-name", _) => None,
            (_, Some(default)) => Some(default.clone()),
            (_, None) => None,
        };
        let got = flag_text(value).filter(|v| !v.is_empty());
        if got != expected {
            problems.push(format!(
                "serve.{name} is {got:?}, the flag's default {expected:?}"
            ));
        }
    }
    let binary = server_binary()?;
    for (name, value) in serve {
        if flags.contains_key(name) {
            continue;
        }
        // A hidden flag is for tests: null, so the chart never passes it
        // and the server's default applies.
        if !value.is_null() {
            problems.push(format!(
                "serve.{name} is {value}: a hidden flag stays null (not passed)"
            ));
        }
        // Parsed before --help is acted on: an unknown flag or a bad value
        // fails.
        let arg = format!("--{name}={}", source_default(name)?);
        let accepted = std::process::Command::new(&binary)
            .args(["serve", &arg, "--help"])
            .env_clear()
            .output()?
            .status
            .success();
        if !accepted {
            problems.push(format!("serve.{name}: the server has no such flag"));
        }
    }
    // values.schema.json knows exactly these keys (it refuses others).
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(
        chart_dir().join("values.schema.json"),
    )?)?;
    let known: BTreeSet<&String> = schema["properties"]["serve"]["properties"]
        .as_object()
        .context("values.schema.json: serve")?
        .keys()
        .collect();
    let keys: BTreeSet<&String> = serve.keys().collect();
    if known != keys {
        problems.push(format!(
            "values.schema.json's serve keys differ: {:?}",
            known.symmetric_difference(&keys).collect::<Vec<_>>()
        ));
    }
    // Each key is documented: the line above it is a comment.
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| *l == "serve:")
        .context("no serve:")?;
    for (i, line) in lines.iter().enumerate().skip(start + 1) {
        if !line.starts_with(' ') && !line.is_empty() {
            break;
        }
        let is_key = line.starts_with("  ") && !line.starts_with("   ") && !line.contains('#');
        if is_key && !lines[i - 1].trim_start().starts_with('#') {
            problems.push(format!("values.yaml: no comment above `{}`", line.trim()));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// The check above is only as good as its parser: it must see the flags,
/// their environment variables and defaults as the server prints them, and
/// find a hidden flag's default in the source.
#[test]
fn the_help_parser_reads_defaults_and_envs() -> Result<()> {
    let flags = serve_flags()?;
    let listen = &flags["listen"];
    assert_eq!(listen.env.as_deref(), Some("AUTONODE_LISTEN"));
    assert_eq!(listen.default.as_deref(), Some("0.0.0.0:8443"));
    assert_eq!(flags["tls-cert"].default, None);
    assert_eq!(flags["install-crds"].default.as_deref(), Some("false"));
    assert_eq!(flags["instance-name"].env.as_deref(), Some("POD_NAME"));
    assert!(!flags.contains_key("nodeclass-resync"), "hidden");
    assert!(!flags.contains_key("check-config"), "a mode, not a setting");
    assert_eq!(source_default("nodeclass-resync")?, "300");
    Ok(())
}

/// `helm lint --strict` with the defaults, for the guest cluster, and with
/// every option on; `helm package` makes the archive and `helm install
/// --dry-run=client` renders it, all offline.
#[test]
fn lint_strict_package_and_install_dry_run() -> Result<()> {
    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    let everything = everything_on();
    let mut shapes: Vec<Vec<&str>> = vec![vec![], vec!["--set", "cluster=guest"]];
    shapes.push(everything.iter().map(String::as_str).collect());
    for shape in &shapes {
        let mut args = vec!["lint", "--strict", &*chart];
        args.extend(shape.iter().copied());
        let out = helm::helm(&args)?;
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
    let dir = tempfile::tempdir()?;
    let dest = dir.path().to_string_lossy().into_owned();
    helm::helm(&["package", &chart, "--destination", &dest])?;
    // The chart's version is the workspace's, as the packages' and the
    // image's are (and so is appVersion, the image tag it defaults to).
    let version = env!("CARGO_PKG_VERSION");
    let archive = dir.path().join(format!("autonode-server-{version}.tgz"));
    let meta: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml"))?)?;
    assert_eq!(meta["appVersion"], version);
    ensure!(archive.exists(), "no {}", archive.display());
    let out = helm::helm(&[
        "install",
        "autonode-server",
        &archive.to_string_lossy(),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
    ])?;
    assert!(out.contains("kind: Deployment"), "{out}");
    // A cluster the chart does not know is refused, not rendered empty.
    let wrong = helm::run(
        &helm::helm_binary()?,
        &["template", "x", &chart, "--set", "cluster=guests"],
    )?;
    assert!(
        !wrong.ok && wrong.stderr.contains("'management', 'guest'"),
        "{}",
        wrong.stderr
    );
    // The chart is for its own release: an image tag of another minor
    // release (an older server refuses this chart's newer flags and
    // crash-loops) is refused; its own, a patch of it, or a tag that is no
    // version render.
    let minor = version
        .rsplitn(2, '.')
        .last()
        .unwrap_or_default()
        .to_string();
    let (major, minor_n) = minor.split_once('.').context("appVersion X.Y.Z")?;
    let mut tags = vec![
        (version.to_string(), true),
        (format!("{minor}.7"), true),
        (format!("v{minor}.0"), true),
        ("latest".to_string(), true),
        (format!("{}.{minor_n}.0", major.parse::<u64>()? + 1), false),
    ];
    if let Some(earlier) = minor_n.parse::<u64>()?.checked_sub(1) {
        tags.push((format!("{major}.{earlier}.0"), false));
    }
    for (tag, renders) in tags {
        let set = format!("image.tag={tag}");
        let run = helm::run(
            &helm::helm_binary()?,
            &["template", "x", &chart, "--set-string", &set],
        )?;
        assert_eq!(run.ok, renders, "{set}: {}", run.stderr);
        if !renders {
            assert!(
                run.stderr.contains("renders the flags of its own")
                    && run.stderr.contains("helm rollback"),
                "{}",
                run.stderr
            );
        }
    }
    // values.schema.json refuses a `serve` key that is no flag (a typo
    // would otherwise be a server that does not start).
    let typo = helm::run(
        &helm::helm_binary()?,
        &["template", "x", &chart, "--set", "serve.max-conections=5"],
    )?;
    assert!(
        !typo.ok && typo.stderr.contains("max-conections"),
        "{}",
        typo.stderr
    );
    Ok(())
}

/// A PEM-ish placeholder: the chart does not parse certificates.
const FAKE_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

/// `--set-string` arguments turning on every option the chart has. The
/// PrometheusRule and the dashboard need files another part of the project
/// writes: they are on once those files are in the chart
/// (`optional_objects_follow_their_values` checks both ways).
fn everything_on() -> Vec<String> {
    let mut settings = vec![
        "tls.create=true".to_string(),
        format!("tls.cert={FAKE_PEM}"),
        "tls.key=key".into(),
        "tls.ca=ca".into(),
        "guestKubeconfig.create=true".into(),
        "guestKubeconfig.kubeconfig=apiVersion: v1".into(),
        "monitoring.serviceMonitor.enabled=true".into(),
        "service.type=LoadBalancer".into(),
        "service.externalTrafficPolicy=Local".into(),
        "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::123456789012:role/x"
            .into(),
    ];
    if chart_file("prometheus-rules.yaml").exists() {
        settings.push("monitoring.prometheusRule.enabled=true".into());
    }
    if chart_file("grafana-dashboard.json").exists() {
        settings.push("monitoring.grafanaDashboard.enabled=true".into());
    }
    settings
        .into_iter()
        .flat_map(|s| ["--set-string".to_string(), s])
        .collect()
}

fn chart_file(name: &str) -> std::path::PathBuf {
    chart_dir().join("files").join(name)
}

fn kinds(docs: &[Value]) -> BTreeSet<String> {
    docs.iter()
        .filter_map(|d| d["kind"].as_str().map(str::to_string))
        .collect()
}

fn container(docs: &[Value]) -> Result<&Value> {
    Ok(&only(docs, "Deployment")?["spec"]["template"]["spec"]["containers"][0])
}

fn args(docs: &[Value]) -> Result<Vec<String>> {
    Ok(container(docs)?["args"]
        .as_array()
        .context("args")?
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect())
}

/// The defaults: the server and nothing optional; every `serve` value in
/// the args; the Secrets referenced by name, not made; probes on the
/// metrics port; a PodDisruptionBudget and topology spread selecting the
/// pods.
#[test]
fn the_defaults_render_the_server_only() -> Result<()> {
    let docs = template(NAMESPACE, &[])?;
    let expected: BTreeSet<String> = [
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(kinds(&docs), expected);
    for doc in &docs {
        assert_eq!(doc["metadata"]["namespace"], NAMESPACE, "{doc}");
    }
    let args = args(&docs)?;
    assert_eq!(args[0], "serve");
    let (values, _) = values()?;
    for (name, value) in values["serve"].as_object().context("serve")? {
        let wanted = match (name.as_str(), flag_text(value)) {
            ("tls-cert", None) => Some("/etc/autonode/tls/tls.crt".to_string()),
            ("tls-key", None) => Some("/etc/autonode/tls/tls.key".to_string()),
            ("kubeconfig", None) => Some("/etc/autonode/guest/kubeconfig".to_string()),
            ("seal-key-file", None) => Some("/etc/autonode/seal/seal.key".to_string()),
            ("previous-seal-key-file", None) => Some("/etc/autonode/seal/previous.key".to_string()),
            ("allowed-accounts" | "allowed-regions", v) => v,
            (_, Some(v)) if v.is_empty() => None,
            (_, v) => v,
        };
        let given: Vec<&String> = args
            .iter()
            .filter(|a| a.starts_with(&format!("--{name}=")))
            .collect();
        match wanted {
            Some(v) => assert_eq!(given, [&format!("--{name}={v}")], "{name}"),
            None => assert!(given.is_empty(), "{name}: {given:?}"),
        }
    }
    let pod = &only(&docs, "Deployment")?["spec"]["template"];
    let c = container(&docs)?;
    assert_eq!(c["env"][0]["name"], "POD_NAME");
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path);
        assert_eq!(c[probe]["httpGet"]["port"], "metrics");
    }
    assert_eq!(
        c["ports"][1],
        json!({"name": "metrics", "containerPort": 9090, "protocol": "TCP"})
    );
    assert_eq!(c["resources"]["requests"]["memory"], "128Mi");
    assert_eq!(c["resources"]["limits"]["memory"], "256Mi");
    assert!(
        c["resources"]["limits"].get("cpu").is_none(),
        "no CPU limit"
    );
    let secrets: Vec<&str> = pod["spec"]["volumes"]
        .as_array()
        .context("volumes")?
        .iter()
        .filter_map(|v| v["secret"]["secretName"].as_str())
        .collect();
    assert_eq!(
        secrets,
        [
            "autonode-server-tls",
            "autonode-guest-kubeconfig",
            "autonode-seal-key"
        ]
    );
    let labels = &pod["metadata"]["labels"];
    let selects = |selector: &Value| -> Result<()> {
        for (k, v) in selector.as_object().context("selector")? {
            ensure!(&labels[k] == v, "selector {k}={v} misses the pods");
        }
        Ok(())
    };
    selects(&only(&docs, "PodDisruptionBudget")?["spec"]["selector"]["matchLabels"])?;
    selects(&only(&docs, "Service")?["spec"]["selector"])?;
    let spread = pod["spec"]["topologySpreadConstraints"]
        .as_array()
        .context("topologySpreadConstraints")?;
    let keys: Vec<&str> = spread
        .iter()
        .filter_map(|c| c["topologyKey"].as_str())
        .collect();
    assert_eq!(
        keys,
        ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    );
    for constraint in spread {
        selects(&constraint["labelSelector"]["matchLabels"])?;
    }
    Ok(())
}

/// Values reach the args as the flags take them; ports and probes follow
/// the listen addresses.
#[test]
fn values_become_flags() -> Result<()> {
    let docs = template(
        NAMESPACE,
        &[
            "--set",
            "serve.allowed-accounts={123456789012,210987654321}",
            "--set",
            "serve.max-connections=1000000",
            "--set",
            "serve.metrics-listen=[::]:9191",
            "--set",
            "serve.ignition-secrets=false",
            "--set-string",
            "serve.public-url=https://autonode.example.com:8443",
        ],
    )?;
    let args = args(&docs)?;
    for wanted in [
        "--allowed-accounts=123456789012,210987654321",
        "--max-connections=1000000",
        "--metrics-listen=[::]:9191",
        "--ignition-secrets=false",
        "--public-url=https://autonode.example.com:8443",
    ] {
        assert!(args.iter().any(|a| a == wanted), "{wanted} not in {args:?}");
    }
    let c = container(&docs)?;
    assert_eq!(c["ports"][1]["containerPort"], 9191);
    // The real server accepts them: every flag known, every value valid.
    if let Err(refusal) = server_accepts(&args)? {
        panic!("{refusal}");
    }
    Ok(())
}

/// `autonode-server <args> --check-config` with an empty environment:
/// Ok when serve would start with these settings, else what it said.
fn server_accepts(args: &[String]) -> Result<Result<(), String>> {
    let out = std::process::Command::new(server_binary()?)
        .args(args)
        .arg("--check-config")
        .env_clear()
        .output()?;
    Ok(if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "serve refused: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })
}

/// `helm template` with `set` (`--set` or `--set-string`, and its
/// `serve.<key>=<value>`): the rendered args, or helm's refusal.
fn render_one(set: [&str; 2]) -> Result<Result<Vec<String>, String>> {
    let chart = chart_dir();
    let mut all = vec!["template", "x", chart.to_str().context("chart path")?];
    all.extend(set);
    let run = helm::run(&helm::helm_binary()?, &all)?;
    if !run.ok {
        return Ok(Err(run.stderr));
    }
    Ok(Ok(args(&documents(&run.stdout)?)?))
}

/// `--set` or `--set-string`, and its `serve.<key>=<value>`.
type SetArg = [String; 2];

/// Values of a `serve` key just inside and just outside what
/// values.schema.json allows, as `--set`/`--set-string` pairs: an
/// integer's minimum and maximum and one past each, an enum's values and
/// one that is none of them, a listen address's extremes. Every integer
/// has a minimum (a server's count or duration is never negative, and a
/// missing one hides a refused 0).
fn edges(key: &str, prop: &Value) -> Result<(Vec<SetArg>, Vec<SetArg>)> {
    let set = |v: String| ["--set".to_string(), format!("serve.{key}={v}")];
    let set_string = |v: &str| ["--set-string".to_string(), format!("serve.{key}={v}")];
    let types = match &prop["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    if types.contains(&"integer") {
        let min = prop["minimum"]
            .as_i64()
            .with_context(|| format!("serve.{key}: an integer without a minimum"))?;
        inside.push(set(min.to_string()));
        outside.push(set((min - 1).to_string()));
        if let Some(max) = prop["maximum"].as_i64() {
            inside.push(set(max.to_string()));
            outside.push(set((max + 1).to_string()));
        }
    } else if let Some(values) = prop["enum"].as_array() {
        inside.extend(values.iter().filter_map(Value::as_str).map(set_string));
        outside.push(set_string("not-one-of-them"));
    } else if prop["pattern"].as_str().is_some_and(|p| !p.contains(':')) {
        // A release version (min-agent-version): X.Y.Z, nothing else.
        inside.extend(["0.2.0", "0.3.0", "10.20.30"].map(set_string));
        outside.extend(["0.3", "0.3.0-dev", "v0.3.0", "0.3.0.1", ""].map(set_string));
    } else if prop["pattern"].is_string() {
        inside.extend(["0.0.0.0:1", "[::]:65535", "127.0.0.1:8080"].map(set_string));
        outside
            .extend(["localhost:8443", "0.0.0.0:0", "0.0.0.0:65536", "8443", ""].map(set_string));
        // Null removes the key from the values: a required key is refused.
        outside.push(set("null".into()));
    }
    Ok((inside, outside))
}

/// values.schema.json refuses every value the server would refuse for the
/// keys it bounds (no crash-looping Deployment from a value helm took):
/// for each integer, enum and listen address of `serve`, helm refuses a
/// value just outside the schema's bounds, and the real server's argument
/// parser (`serve --check-config`) accepts the args the chart renders for
/// each value just inside. A bound the server tightens (a minimum of 1, a
/// maximum) without the schema following fails here.
#[test]
fn the_schema_bounds_are_the_servers() -> Result<()> {
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(
        chart_dir().join("values.schema.json"),
    )?)?;
    let props = schema["properties"]["serve"]["properties"]
        .as_object()
        .context("values.schema.json: serve")?;
    let (mut problems, mut checked) = (Vec::new(), 0);
    for (key, prop) in props {
        let (inside, outside) = edges(key, prop)?;
        for [how, set] in &outside {
            checked += 1;
            match render_one([how, set])? {
                Ok(_) => problems.push(format!("helm took {how} {set}")),
                Err(refusal) if !refusal.contains(key.as_str()) => problems.push(format!(
                    "{how} {set}: refused for another reason: {refusal}"
                )),
                Err(_) => {}
            }
        }
        for [how, set] in &inside {
            checked += 1;
            match render_one([how, set])? {
                Err(refusal) => problems.push(format!("helm refused {how} {set}: {refusal}")),
                Ok(args) => {
                    if !args.iter().any(|a| a.starts_with(&format!("--{key}="))) {
                        problems.push(format!("{set}: not in the args {args:?}"));
                    }
                    if let Err(refusal) = server_accepts(&args)? {
                        problems.push(format!("{set}: {refusal}"));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    ensure!(checked > 60, "only {checked} values tried");
    Ok(())
}

/// The check above leans on `--check-config`: it must refuse what serve
/// refuses at start (a value's form, and what only serve's own checks
/// see), naming the flag, and accept the chart's defaults.
#[test]
fn check_config_refuses_what_serve_refuses() -> Result<()> {
    let defaults = args(&template(NAMESPACE, &[])?)?;
    if let Err(refusal) = server_accepts(&defaults)? {
        panic!("{refusal}");
    }
    // Each replaces the chart's value of its flag (a flag given twice is
    // refused for that alone).
    let with = |given: &[&str]| -> Vec<String> {
        let flag = |a: &str| a.split_once('=').map(|(f, _)| f.to_string());
        let replaced: BTreeSet<Option<String>> = given.iter().map(|g| flag(g)).collect();
        let mut args: Vec<String> = defaults
            .iter()
            .filter(|a| !replaced.contains(&flag(a)))
            .cloned()
            .collect();
        args.extend(given.iter().map(|g| g.to_string()));
        args
    };
    for (bad, named) in [
        (&["--max-connections=0"][..], "--max-connections"),
        (&["--log-format=xml"], "--log-format"),
        (&["--agent-deadline=901"], "--agent-deadline"),
        (&["--ami-ids=amd64=ubuntu"], "--ami-ids"),
        (&["--capacity-tolerance=101"], "--capacity-tolerance"),
        (
            &["--nodeclass-selector=autonode.dev/managed=true"],
            "--nodeclass-selector",
        ),
        (
            &["--base-ignition=secret/base", "--ignition-secrets=false"],
            "--ignition-secrets=false",
        ),
    ] {
        let refusal = server_accepts(&with(bad))?
            .err()
            .with_context(|| format!("{bad:?} accepted"))?;
        ensure!(refusal.contains(named), "{bad:?}: {refusal}");
    }
    // A --config file is checked too; the mode itself is no setting of it.
    let dir = tempfile::tempdir()?;
    for (toml, refused) in [
        ("log-format = \"json\"\n", None),
        ("log-format = \"xml\"\n", Some("--log-format")),
        (
            "check-config = true\n",
            Some("unknown setting `check-config`"),
        ),
    ] {
        let file = dir.path().join("serve.toml");
        std::fs::write(&file, toml)?;
        // The chart's --log-format left out, so the file's is the one read.
        let mut args: Vec<String> = defaults
            .iter()
            .filter(|a| !a.starts_with("--log-format="))
            .cloned()
            .collect();
        args.push(format!("--config={}", file.display()));
        match (server_accepts(&args)?, refused) {
            (Ok(()), None) => {}
            (Err(refusal), Some(named)) if refusal.contains(named) => {}
            (got, _) => bail!("{toml:?}: {got:?}"),
        }
    }
    // Given both ways, the flag wins and the file's value is never parsed:
    // the chart's valid --log-format over a file's invalid one is accepted,
    // an invalid flag over a file's valid one refused.
    let file = dir.path().join("serve.toml");
    for (toml, flag, refused) in [
        ("log-format = \"xml\"\n", "--log-format=json", false),
        ("log-format = \"json\"\n", "--log-format=xml", true),
    ] {
        std::fs::write(&file, toml)?;
        let mut args = with(&[flag]);
        args.push(format!("--config={}", file.display()));
        match server_accepts(&args)? {
            Ok(()) if !refused => {}
            Err(refusal) if refused && refusal.contains("--log-format") => {}
            got => bail!("{toml:?} with {flag}: {got:?}"),
        }
    }
    Ok(())
}

/// Secrets made from values (TLS with its CA, the kubeconfig under the
/// chosen key) and named in the volumes; or only referenced, by the names
/// given.
#[test]
fn secrets_created_or_referenced() -> Result<()> {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let docs = template(
        NAMESPACE,
        &[
            "--set",
            "tls.create=true",
            "--set-string",
            &format!("tls.cert={FAKE_PEM}"),
            "--set-string",
            "tls.key=the-key",
            "--set",
            "guestKubeconfig.create=true",
            "--set",
            "guestKubeconfig.key=config",
            "--set-string",
            "guestKubeconfig.kubeconfig=kind: Config",
        ],
    )?;
    let secrets: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Secret").collect();
    assert_eq!(secrets.len(), 2);
    let tls = secrets
        .iter()
        .find(|s| s["type"] == "kubernetes.io/tls")
        .context("no TLS Secret")?;
    assert_eq!(tls["metadata"]["name"], "autonode-server-tls");
    assert_eq!(tls["data"]["tls.crt"], b64(FAKE_PEM));
    assert_eq!(tls["data"]["tls.key"], b64("the-key"));
    assert!(tls["data"].get("ca.crt").is_none(), "no CA given");
    let kubeconfig = secrets
        .iter()
        .find(|s| s["type"] == "Opaque")
        .context("no kubeconfig Secret")?;
    assert_eq!(kubeconfig["data"]["config"], b64("kind: Config"));
    let volumes = &only(&docs, "Deployment")?["spec"]["template"]["spec"]["volumes"];
    assert_eq!(volumes[1]["secret"]["items"][0]["key"], "config");
    // The server reads its kubeconfig once: a new one rolls the pods.
    let checksum = |docs: &[Value]| -> Result<Value> {
        Ok(
            only(docs, "Deployment")?["spec"]["template"]["metadata"]["annotations"]
                ["checksum/guest-kubeconfig"]
                .clone(),
        )
    };
    let other = template(
        NAMESPACE,
        &[
            "--set",
            "guestKubeconfig.create=true",
            "--set-string",
            "guestKubeconfig.kubeconfig=kind: Config # rotated",
        ],
    )?;
    ensure!(checksum(&docs)?.is_string(), "no checksum annotation");
    assert_ne!(checksum(&docs)?, checksum(&other)?);

    let referenced = template(
        NAMESPACE,
        &[
            "--set",
            "tls.secretName=my-tls",
            "--set",
            "guestKubeconfig.secretName=my-guest",
        ],
    )?;
    assert!(!kinds(&referenced).contains("Secret"));
    let volumes = &only(&referenced, "Deployment")?["spec"]["template"]["spec"]["volumes"];
    assert_eq!(volumes[0]["secret"]["secretName"], "my-tls");
    assert_eq!(volumes[1]["secret"]["secretName"], "my-guest");

    // Asked to make a Secret without its content: refused, not empty.
    let chart = chart_dir();
    let missing = helm::run(
        &helm::helm_binary()?,
        &[
            "template",
            "x",
            &chart.to_string_lossy(),
            "--set",
            "tls.create=true",
        ],
    )?;
    assert!(
        !missing.ok && missing.stderr.contains("tls.cert"),
        "{}",
        missing.stderr
    );
    Ok(())
}

/// The sealing key: by default the sealKey Secret, mounted whole (its
/// optional previous.key with it) and passed as --seal-key-file and
/// --previous-seal-key-file; never made where helm cannot read the cluster
/// (`helm template`: a key made there would be new at every render). The
/// deprecated rolloutStateKey, when named, is the sealing key instead.
#[test]
fn the_sealing_key_is_a_secret_of_its_own_kept_across_renders() -> Result<()> {
    let plain = template(NAMESPACE, &[])?;
    let given = args(&plain)?;
    for flag in [
        "--seal-key-file=/etc/autonode/seal/seal.key",
        "--previous-seal-key-file=/etc/autonode/seal/previous.key",
    ] {
        ensure!(given.iter().any(|a| a == flag), "{flag}: {given:?}");
    }
    ensure!(!given
        .iter()
        .any(|a| a.starts_with("--rollout-state-key-file")));
    let volumes = &only(&plain, "Deployment")?["spec"]["template"]["spec"]["volumes"];
    let whole = volumes.as_array().into_iter().flatten().any(|v| {
        v["secret"]["secretName"] == "autonode-seal-key" && v["secret"]["items"].is_null()
    });
    ensure!(whole, "{volumes}");
    ensure!(
        !plain.iter().any(|d| d["kind"] == "Secret"),
        "helm template makes no key"
    );

    const FLAG: &str = "--seal-key-file=/etc/autonode/rollout-state-key/key";
    let docs = template(
        NAMESPACE,
        &[
            "--set",
            "rolloutStateKey.secretName=rk",
            "--set",
            "rolloutStateKey.create=true",
            "--set-string",
            "rolloutStateKey.value=0123456789abcdef0123456789abcdef",
        ],
    )?;
    let given = args(&docs)?;
    ensure!(given.iter().any(|a| a == FLAG), "{given:?}");
    ensure!(!given
        .iter()
        .any(|a| a.starts_with("--previous-seal-key-file")));
    let volumes = &only(&docs, "Deployment")?["spec"]["template"]["spec"]["volumes"];
    let mounted = volumes
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| v["secret"]["secretName"] == "rk" && v["secret"]["items"][0]["path"] == "key");
    ensure!(mounted, "{volumes}");
    ensure!(
        !volumes.to_string().contains("autonode-seal-key"),
        "{volumes}"
    );
    ensure!(docs
        .iter()
        .any(|d| d["kind"] == "Secret" && d["metadata"]["name"] == "rk"));
    Ok(())
}

/// Each optional object comes and goes with its value: the PDB, the
/// ServiceAccount, the ServiceMonitor; the PrometheusRule's groups are
/// files/prometheus-rules.yaml's and the dashboard is
/// files/grafana-dashboard.json (with either file missing, enabling it is
/// an error naming the file).
#[test]
fn optional_objects_follow_their_values() -> Result<()> {
    let off = template(
        NAMESPACE,
        &[
            "--set",
            "podDisruptionBudget.enabled=false",
            "--set",
            "serviceAccount.create=false",
            "--set",
            "serviceAccount.name=existing",
        ],
    )?;
    assert!(!kinds(&off).contains("PodDisruptionBudget"));
    assert!(!kinds(&off).contains("ServiceAccount"));
    assert_eq!(
        only(&off, "Deployment")?["spec"]["template"]["spec"]["serviceAccountName"],
        "existing"
    );
    let pdb = template(
        NAMESPACE,
        &[
            "--set",
            "podDisruptionBudget.maxUnavailable=1",
            "--set",
            "podDisruptionBudget.minAvailable=null",
        ],
    )?;
    let spec = &only(&pdb, "PodDisruptionBudget")?["spec"];
    assert_eq!(spec["maxUnavailable"], 1);
    assert!(spec.get("minAvailable").is_none());

    let monitor = template(
        NAMESPACE,
        &[
            "--set",
            "monitoring.serviceMonitor.enabled=true",
            "--set",
            "monitoring.serviceMonitor.labels.release=prom",
        ],
    )?;
    let sm = only(&monitor, "ServiceMonitor")?;
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    let service = only(&monitor, "Service")?;
    for (k, v) in sm["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("ServiceMonitor selector")?
    {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "the Service lacks {k}"
        );
    }

    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    for (value, file) in [
        (
            "monitoring.prometheusRule.enabled=true",
            "prometheus-rules.yaml",
        ),
        (
            "monitoring.grafanaDashboard.enabled=true",
            "grafana-dashboard.json",
        ),
    ] {
        let path = chart_file(file);
        if !path.exists() {
            let run = helm::run(
                &helm::helm_binary()?,
                &["template", "x", &chart, "--set", value],
            )?;
            assert!(!run.ok && run.stderr.contains(file), "{}", run.stderr);
            continue;
        }
        let docs = template(NAMESPACE, &["--set", value])?;
        let text = std::fs::read_to_string(&path)?;
        if file.ends_with(".yaml") {
            let rules: Value = serde_yaml::from_str(&text)?;
            let rule = only(&docs, "PrometheusRule")?;
            assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
            ensure!(rules["groups"].is_array(), "{file}: no groups");
            assert_eq!(rule["spec"]["groups"], rules["groups"]);
        } else {
            let map = docs
                .iter()
                .find(|d| d["kind"] == "ConfigMap")
                .context("no dashboard ConfigMap")?;
            assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
            let data = map["data"]["autonode-server.json"]
                .as_str()
                .context("dashboard data")?;
            let parsed: Value = serde_json::from_str(data).context("dashboard JSON")?;
            assert_eq!(parsed, serde_json::from_str::<Value>(&text)?);
        }
    }
    Ok(())
}

/// The guest RBAC the chart renders (`cluster=guest`), metadata.labels
/// left out, for `sets` (`serve.<flag>=<bool>`), for helm's default
/// Kubernetes version.
fn chart_guest_rbac(sets: &[String]) -> Result<Vec<Value>> {
    chart_guest_rbac_at(None, sets)
}

/// [`chart_guest_rbac`] for a guest cluster at `version`.
fn chart_guest_rbac_at(version: Option<KubeVersion>, sets: &[String]) -> Result<Vec<Value>> {
    let version = version.map(|v| v.to_string());
    let mut args = vec!["--set", "cluster=guest"];
    if let Some(version) = &version {
        args.extend(["--kube-version", version.as_str()]);
    }
    for set in sets {
        args.extend(["--set", set.as_str()]);
    }
    let mut docs = template("default", &args)?;
    for doc in &mut docs {
        if let Some(meta) = doc["metadata"].as_object_mut() {
            meta.remove("labels");
        }
    }
    Ok(docs)
}

/// The objects of the packaging/guest files `rbac` names.
fn kustomize_guest_rbac(rbac: &GuestRbac) -> Result<Vec<Value>> {
    let wanted = rbac.files();
    let mut docs = Vec::new();
    for (name, text) in GUEST_RBAC_FILES {
        if wanted.contains(&name) {
            docs.extend(documents(text)?);
        }
    }
    Ok(docs)
}

fn sorted(docs: &[Value]) -> Vec<String> {
    let mut texts: Vec<String> = docs.iter().map(Value::to_string).collect();
    texts.sort();
    texts
}

/// For every setting of the four flags that change the guest RBAC, the
/// chart renders exactly the objects of the packaging/guest files those
/// flags call for (compared as parsed objects, labels aside); with other
/// namespaces for Ignition and the Lease, the namespaced grants move there.
#[test]
fn guest_rbac_matches_packaging_guest_for_every_flag_setting() -> Result<()> {
    let flags = [
        "ignition-secrets",
        "delete-failed-nodeclaims",
        "manage-nodeclasses",
        "install-crds",
    ];
    for bits in 0..(1u32 << flags.len()) {
        let settings: Vec<(&str, bool)> = flags
            .iter()
            .enumerate()
            .map(|(i, f)| (*f, bits & (1 << i) != 0))
            .collect();
        let sets: Vec<String> = settings
            .iter()
            .map(|(f, on)| format!("serve.{f}={on}"))
            .collect();
        let args: Vec<String> = settings
            .iter()
            .map(|(f, on)| format!("--{f}={on}"))
            .collect();
        let chart = chart_guest_rbac(&sets)?;
        let base = kustomize_guest_rbac(&GuestRbac::for_flags(&args))?;
        assert_eq!(sorted(&chart), sorted(&base), "{args:?}");
    }

    let moved = chart_guest_rbac(&[
        "serve.ignition-namespace=ignition".into(),
        "serve.leader-namespace=leader".into(),
    ])?;
    let namespace_of = |name: &str| -> Result<String> {
        let role = moved
            .iter()
            .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == name)
            .with_context(|| format!("no Role {name}"))?;
        Ok(role["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string())
    };
    assert_eq!(namespace_of("autonode-server-ignition")?, "ignition");
    assert_eq!(
        namespace_of("autonode-server-ignition-secrets")?,
        "ignition"
    );
    assert_eq!(namespace_of("autonode-server-leader-election")?, "leader");
    assert_eq!(
        namespace_of_settings(&moved)?,
        "autonode-system",
        "the policy's settings stay beside the server's ServiceAccount"
    );
    assert_eq!(namespace_of("autonode-server-events")?, "default");
    let namespaces: BTreeSet<&str> = moved
        .iter()
        .filter(|d| d["kind"] == "Namespace")
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        namespaces,
        BTreeSet::from(["autonode-system", "ignition", "leader"])
    );
    Ok(())
}

/// The namespace of the admission policy's settings ConfigMap in `docs`.
fn namespace_of_settings(docs: &[Value]) -> Result<String> {
    let map = admission_settings(docs).context("no admission settings")?;
    Ok(map["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// The admission policy's settings ConfigMap among `docs`.
fn admission_settings(docs: &[Value]) -> Option<&Value> {
    docs.iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == NODECLASS_ADMISSION_SETTINGS)
}

/// The EC2NodeClass admission policy follows the upkeep's values as the
/// harness (and docs/rbac.md, for Kustomize) turn the flags into its
/// settings, and is rendered for a guest at 1.30 or later only: the
/// version `helm template --kube-version` names.
#[test]
fn the_nodeclass_admission_policy_follows_the_upkeep_values_and_the_version() -> Result<()> {
    let sets = [
        "serve.nodeclass-names={kept,other}".to_string(),
        "serve.ami-ids={amd64=ami-1,arm64=ami-2}".to_string(),
        "serve.enforce-metadata-options=false".to_string(),
    ];
    let args = [
        "--nodeclass-names=kept,other".to_string(),
        "--ami-ids=amd64=ami-1,arm64=ami-2".to_string(),
        "--enforce-metadata-options=false".to_string(),
    ];
    let chart = chart_guest_rbac(&sets)?;
    let settings = admission_settings(&chart).context("no admission settings")?;
    assert_eq!(settings["data"], nodeclass_admission_settings(&args));
    let defaults = chart_guest_rbac(&[])?;
    let settings = admission_settings(&defaults).context("no admission settings")?;
    assert_eq!(settings["data"], nodeclass_admission_settings(&[]));

    let policy_kinds = |docs: &[Value]| -> BTreeSet<String> {
        docs.iter()
            .filter_map(|d| d["kind"].as_str())
            .filter(|k| k.starts_with("ValidatingAdmissionPolicy"))
            .map(str::to_string)
            .collect()
    };
    let both = BTreeSet::from([
        "ValidatingAdmissionPolicy".to_string(),
        "ValidatingAdmissionPolicyBinding".to_string(),
    ]);
    let at = |minor| chart_guest_rbac_at(Some(KubeVersion::new(1, minor, 0)), &[]);
    assert_eq!(policy_kinds(&at(30)?), both);
    let older = at(29)?;
    assert!(policy_kinds(&older).is_empty(), "a policy for 1.29");
    assert!(admission_settings(&older).is_none());
    Ok(())
}

/// The effective `serve` settings of a Deployment's container: each flag's
/// default, overridden by its environment variable (literal `value`s, and
/// `envFrom` ConfigMaps found in `docs`), overridden by `--flag=value`
/// args, as the server itself resolves them.
fn effective_settings(
    docs: &[Value],
    flags: &BTreeMap<String, Flag>,
) -> Result<BTreeMap<String, String>> {
    let mut settings: BTreeMap<String, String> = flags
        .iter()
        .filter_map(|(name, f)| f.default.clone().map(|d| (name.clone(), d)))
        .collect();
    let by_env: BTreeMap<&str, &str> = flags
        .iter()
        .filter_map(|(name, f)| f.env.as_deref().map(|e| (e, name.as_str())))
        .collect();
    let c = container(docs)?;
    let mut env: Vec<(String, String)> = Vec::new();
    for from in c["envFrom"].as_array().into_iter().flatten() {
        let name = &from["configMapRef"]["name"];
        let map = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && &d["metadata"]["name"] == name)
            .with_context(|| format!("envFrom names ConfigMap {name}, not rendered"))?;
        for (k, v) in map["data"].as_object().into_iter().flatten() {
            env.push((k.clone(), v.as_str().unwrap_or_default().to_string()));
        }
    }
    for var in c["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap_or_default().to_string();
        // The downward API's value is the pod's: the same on both sides
        // when both point at the same field.
        let value = match var["value"].as_str() {
            Some(v) => v.to_string(),
            None => format!("<{}>", var["valueFrom"]),
        };
        env.push((name, value));
    }
    for (name, value) in env {
        if let Some(flag) = by_env.get(name.as_str()) {
            settings.insert(flag.to_string(), value);
        }
    }
    let args = args(docs)?;
    ensure!(
        args.first().map(String::as_str) == Some("serve"),
        "{args:?}"
    );
    for arg in &args[1..] {
        let (name, value) = arg
            .strip_prefix("--")
            .and_then(|a| a.split_once('='))
            .with_context(|| format!("arg {arg} is not --flag=value"))?;
        settings.insert(name.to_string(), value.to_string());
    }
    Ok(settings)
}

/// `kubectl kustomize` of a directory of the workspace with today's
/// kubectl (the one install-helm caches).
fn kustomize(dir: &str) -> Result<Vec<Value>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let run = helm::run(
        &helm::kubectl_binary()?,
        &["kustomize", &path.to_string_lossy()],
    )?;
    ensure!(run.ok, "kubectl kustomize {dir}: {}", run.stderr);
    documents(&run.stdout)
}

/// The Kustomize base and the chart with the base's settings (its
/// ConfigMap: `log-format: json`, no accounts or regions) run the server
/// with the same effective settings, mount the same Secrets at the same
/// paths, and have the same ports, probes, resources and security
/// contexts; and today's Kustomize builds packaging/guest into the objects
/// of its files.
#[test]
fn chart_and_kustomize_base_stay_in_step() -> Result<()> {
    let flags = serve_flags()?;
    let base = kustomize("packaging/server")?;
    let chart = template(NAMESPACE, &["--set", "serve.log-format=json"])?;
    let (ours, theirs) = (
        effective_settings(&chart, &flags)?,
        effective_settings(&base, &flags)?,
    );
    assert_eq!(ours, theirs, "chart (left) and packaging/server (right)");
    assert_eq!(
        ours["log-format"], "json",
        "the comparison sees the ConfigMap"
    );

    let (c, k) = (container(&chart)?, container(&base)?);
    for field in [
        "ports",
        "livenessProbe",
        "readinessProbe",
        "resources",
        "securityContext",
        "volumeMounts",
        "imagePullPolicy",
    ] {
        assert_eq!(c[field], k[field], "container {field}");
    }
    let pod = |docs: &[Value]| -> Result<Value> {
        Ok(only(docs, "Deployment")?["spec"]["template"]["spec"].clone())
    };
    let (cp, kp) = (pod(&chart)?, pod(&base)?);
    // Scheduling differs on purpose and is not compared: the base keeps
    // replicas on different nodes with a preferred podAntiAffinity, the
    // chart spreads them over zones and hosts with
    // topologySpreadConstraints (whenUnsatisfiable: ScheduleAnyway) whose
    // selectors it fills in from the release. Both only prefer: neither
    // leaves a replica unscheduled.
    for field in [
        "securityContext",
        "automountServiceAccountToken",
        "enableServiceLinks",
        "terminationGracePeriodSeconds",
    ] {
        assert_eq!(cp[field], kp[field], "pod {field}");
    }
    let secret_volumes = |spec: &Value| -> Vec<Value> {
        spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| json!({"name": v["name"], "secretName": v["secret"]["secretName"], "items": v["secret"]["items"]}))
            .collect()
    };
    assert_eq!(secret_volumes(&cp), secret_volumes(&kp));
    for (kind, field) in [
        ("Deployment", "replicas"),
        ("Deployment", "strategy"),
        ("PodDisruptionBudget", "minAvailable"),
    ] {
        assert_eq!(
            only(&chart, kind)?["spec"][field],
            only(&base, kind)?["spec"][field],
            "{kind} {field}"
        );
    }
    let ports =
        |docs: &[Value]| -> Result<Value> { Ok(only(docs, "Service")?["spec"]["ports"].clone()) };
    assert_eq!(ports(&chart)?, ports(&base)?);
    assert_eq!(
        only(&chart, "ServiceAccount")?["automountServiceAccountToken"],
        only(&base, "ServiceAccount")?["automountServiceAccountToken"]
    );

    let guest = kustomize("packaging/guest")?;
    let expected = kustomize_guest_rbac(&GuestRbac::default())?;
    assert_eq!(sorted(&guest), sorted(&expected));
    Ok(())
}

/// A server-side dry run of `doc` in `namespace` (cluster-scoped objects
/// without one), as `kubectl apply --server-side --dry-run=server` does:
/// the object as the API server would store it.
async fn dry_run(client: &kube::Client, mut doc: Value, policy_v1: bool) -> Result<DynamicObject> {
    if doc["apiVersion"] == "policy/v1" && !policy_v1 {
        // An API server before 1.21 serves the same schema as v1beta1.
        doc["apiVersion"] = "policy/v1beta1".into();
    }
    let object: DynamicObject = serde_json::from_value(doc)?;
    let types = object.types.clone().context("apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(&types)?;
    let (resource, caps) = pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match (&caps.scope, &object.metadata.namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced, None) => bail!("{} without a namespace", gvk.kind),
        _ => Api::all_with(client.clone(), &resource),
    };
    let name = object.metadata.name.clone().context("name")?;
    let mut params = PatchParams::apply("autonode-tests").force();
    params.dry_run = true;
    api.patch(&name, &params, &Patch::Apply(&object))
        .await
        .with_context(|| format!("server-side dry run of {} {name}", gvk.kind))
}

/// Minimal CRDs of the two prometheus-operator kinds the chart renders
/// (tests/crds/: the fields it uses, typed as the operator types them).
const MONITORING_CRDS: [(&str, &str); 2] = [
    (
        "servicemonitors",
        include_str!("../../crds/monitoring.coreos.com_servicemonitors.yaml"),
    ),
    (
        "prometheusrules",
        include_str!("../../crds/monitoring.coreos.com_prometheusrules.yaml"),
    ),
];

/// A prometheus-operator object's server-side dry run against
/// [`MONITORING_CRDS`]: accepted, and its spec kept whole (the API server
/// prunes a field its CRD lacks instead of refusing it: the request names
/// no `fieldValidation`, and the default only warns).
async fn dry_run_operator_kind(client: &kube::Client, doc: &Value) -> Result<()> {
    let stored = dry_run(client, doc.clone(), true).await?;
    ensure!(
        stored.data["spec"] == doc["spec"],
        "{} spec pruned or changed by its CRD:\nsent   {}\nstored {}",
        doc["kind"],
        doc["spec"],
        stored.data["spec"]
    );
    Ok(())
}

/// The prometheus-operator kinds by shape, beyond what their CRDs check:
/// group, version, namespace, and every rule an alert or a recording rule.
fn check_operator_kind(doc: &Value) -> Result<()> {
    ensure!(doc["apiVersion"] == "monitoring.coreos.com/v1", "{doc}");
    ensure!(doc["metadata"]["namespace"] == NAMESPACE, "{doc}");
    match doc["kind"].as_str() {
        Some("ServiceMonitor") => {
            ensure!(doc["spec"]["selector"]["matchLabels"].is_object(), "{doc}");
            ensure!(doc["spec"]["endpoints"]
                .as_array()
                .is_some_and(|e| !e.is_empty()));
        }
        Some("PrometheusRule") => {
            for group in doc["spec"]["groups"].as_array().context("groups")? {
                ensure!(group["name"].is_string(), "a group without a name");
                for rule in group["rules"].as_array().context("rules")? {
                    ensure!(rule["expr"].is_string(), "a rule without expr: {rule}");
                    ensure!(
                        rule["alert"].is_string() || rule["record"].is_string(),
                        "{rule}"
                    );
                }
            }
        }
        other => bail!("unexpected kind {other:?}"),
    }
    Ok(())
}

/// What the chart renders for the management cluster, defaults and with
/// every option on, passes a real kube-apiserver's server-side dry run
/// (the ServiceMonitor and PrometheusRule against minimal CRDs of theirs,
/// spec kept whole); so does the guest RBAC, for the defaults and with
/// every feature on.
#[tokio::test]
async fn rendered_objects_pass_a_server_side_dry_run() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let client = cp.admin().await?;
    autonode_tests::kube::controlplane::install_crds(&client, &MONITORING_CRDS).await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    let policy_v1 = autonode_tests::kube::controlplane::serves_policy_v1_pdbs(&client).await;

    let everything = everything_on();
    let everything: Vec<&str> = everything.iter().map(String::as_str).collect();
    let mut checked = BTreeSet::new();
    for shape in [vec![], everything] {
        for doc in template(NAMESPACE, &shape)? {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            if doc["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("monitoring.coreos.com/"))
            {
                check_operator_kind(&doc)?;
                dry_run_operator_kind(&client, &doc).await?;
            } else {
                dry_run(&client, doc, policy_v1).await?;
            }
            checked.insert(kind);
        }
    }
    for kind in [
        "Deployment",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
        "Secret",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
    ] {
        assert!(checked.contains(kind), "{kind} never rendered: {checked:?}");
    }
    // The CRDs check what they say: a malformed interval is refused, a
    // field they lack is pruned, which the spec comparison reports.
    let monitor = template(
        NAMESPACE,
        &["--set", "monitoring.serviceMonitor.enabled=true"],
    )?;
    let monitor = only(&monitor, "ServiceMonitor")?;
    let mut bad_interval = monitor.clone();
    bad_interval["spec"]["endpoints"][0]["interval"] = "30 seconds".into();
    ensure!(
        dry_run_operator_kind(&client, &bad_interval).await.is_err(),
        "interval `30 seconds` accepted"
    );
    let mut unknown = monitor.clone();
    unknown["spec"]["endpoints"][0]["honorLabelz"] = true.into();
    ensure!(
        dry_run_operator_kind(&client, &unknown).await.is_err(),
        "an unknown field went unnoticed"
    );
    // The guest RBAC: its Namespace first (helm orders it so), then the
    // rest; a dry-run Namespace is not created, so create it for real.
    for sets in [vec![], vec!["serve.install-crds=true".to_string()]] {
        for doc in chart_guest_rbac_at(Some(cp.version()), &sets)? {
            if doc["kind"] == "Namespace" {
                let name = doc["metadata"]["name"].as_str().unwrap_or_default();
                if namespaces.get_opt(name).await?.is_none() {
                    namespaces
                        .create(
                            &PostParams::default(),
                            &serde_json::from_value(doc.clone())?,
                        )
                        .await?;
                }
            }
            dry_run(&client, doc, policy_v1).await?;
        }
    }
    Ok(())
}

/// The flags of the chart's args that decide the guest RBAC, for `sets`.
fn rbac_flags(sets: &[&str]) -> Result<Vec<String>> {
    let mut args = Vec::new();
    for set in sets {
        args.extend(["--set", *set]);
    }
    let rendered = self::args(&template(NAMESPACE, &args)?)?;
    Ok(rendered
        .into_iter()
        .filter(|a| {
            [
                "--ignition-secrets=",
                "--delete-failed-nodeclaims=",
                "--manage-nodeclasses=",
                "--install-crds=",
            ]
            .iter()
            .any(|p| a.starts_with(p))
        })
        .collect())
}

/// A world whose server runs with the feature flags the chart renders for
/// `sets` and under exactly the guest RBAC the chart renders for them.
async fn world_under_chart_rbac(sets: &[&str]) -> Result<World> {
    let flags = rbac_flags(sets)?;
    ensure!(flags.len() == 4, "the chart passes all four: {flags:?}");
    let mut guest_args: Vec<&str> = Vec::new();
    for set in sets {
        guest_args.extend(["--set", *set]);
    }
    let cp = ControlPlane::start().await?;
    let manifest = guest_rbac_manifest(&guest_args, cp.version())?;
    let cloud = FakeCloud::new()?;
    let ec2 = cloud.start_ec2(REGION)?;
    let setup = Setup {
        extra_args: &flags,
        rbac_manifest: Some(&manifest),
        ..Setup::default()
    };
    let server = TestServer::launch(&cp, &cloud_settings(&cloud, &ec2), &setup).await?;
    let joiner = Joiner::new(server.url(), server.ca_pem())?;
    Ok(World {
        joiner,
        server,
        ec2,
        cloud,
        cp,
    })
}

/// Whether the server's ServiceAccount may delete NodeClaims (a dry run).
async fn may_delete_nodeclaims(world: &World) -> Result<bool> {
    let admin = world.cp.admin().await?;
    // A class the admission policy lets anyone create: no userData, the
    // kept amiFamily and metadata options.
    let spec = standin::custom_spec(json!({}));
    standin::create_nodeclass(&admin, "probe", json!({}), spec).await?;
    standin::create_nodeclaim(&admin, "probe", "probe").await?;
    let params = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    let server = world.server.guest_client().await?;
    match standin::nodeclaims(&server).delete("probe", &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(false),
        Err(e) => Err(e).context("NodeClaim delete probe"),
    }
}

/// The real server, under the guest RBAC the chart renders for the default
/// values and nothing else, turns ready and joins a node (NodeClaim
/// binding, CSRs created and approved, certificates issued); its
/// ServiceAccount may delete NodeClaims, as the defaults need.
#[tokio::test]
async fn the_server_joins_under_the_charts_guest_rbac() -> Result<()> {
    let world = world_under_chart_rbac(&[]).await?;
    let joined = world.join_new(|i| i).await?;
    assert!(joined
        .response
        .client_certificate
        .contains("BEGIN CERTIFICATE"));
    assert!(joined
        .response
        .serving_certificate
        .contains("BEGIN CERTIFICATE"));
    assert!(may_delete_nodeclaims(&world).await?);
    Ok(())
}

/// With the optional features off in the values, the chart's guest RBAC
/// grants none of them, and the server run with the flags the chart
/// renders still turns ready (it lists no Secrets) and joins a node; a
/// NodeClaim delete is refused.
#[tokio::test]
async fn the_server_joins_under_the_charts_narrowest_guest_rbac() -> Result<()> {
    let sets = [
        "serve.ignition-secrets=false",
        "serve.delete-failed-nodeclaims=false",
        "serve.manage-nodeclasses=false",
    ];
    let world = world_under_chart_rbac(&sets).await?;
    world.join_new(|i| i).await?;
    assert!(!may_delete_nodeclaims(&world).await?);
    Ok(())
}

/// Item 3 of issue 48, the chart's part: where helm reads the cluster
/// (`helm upgrade --install`), the sealing key Secret is made once, on an
/// upgrade with the serving key already there as `previous.key` (what the
/// server derived its key from until then), and kept byte for byte by the
/// next upgrade: a new key at every render would void every seal as a new
/// TLS key did.
#[tokio::test]
async fn helm_makes_the_sealing_key_once_and_keeps_it() -> Result<()> {
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    const NS: &str = "autonode-seal";
    let cp = ControlPlane::start().await?;
    let admin = cp.admin().await?;
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await?;
    // The serving certificate's Secret, as cert-manager keeps it.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);
    let tls_key = "-----BEGIN PRIVATE KEY-----\nthe serving key\n-----END PRIVATE KEY-----\n";
    let tls: Secret = serde_json::from_value(json!({
        "metadata": {"name": "autonode-server-tls"}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "cert", "tls.key": tls_key}}))?;
    secrets.create(&PostParams::default(), &tls).await?;

    let kubeconfig = cp.admin_kubeconfig().to_string_lossy().into_owned();
    let chart = chart_dir().to_string_lossy().into_owned();
    let upgrade = || {
        helm::helm(&[
            "upgrade",
            "--install",
            "autonode-server",
            &chart,
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            NS,
        ])
    };
    let key_data = || async {
        let secret = secrets.get("autonode-seal-key").await?;
        anyhow::Ok(secret.data.unwrap_or_default())
    };
    upgrade()?;
    let made = key_data().await?;
    let seal = made.get("seal.key").context("seal.key")?;
    ensure!(seal.0.len() == 32, "32 random bytes: {}", seal.0.len());
    let previous = made.get("previous.key").context("previous.key")?;
    ensure!(
        previous.0 == tls_key.as_bytes(),
        "the TLS key as previous.key"
    );

    upgrade()?;
    ensure!(
        key_data().await? == made,
        "an upgrade changed the sealing key"
    );
    Ok(())
}

/// `attestation.policy` becomes a ConfigMap mounted whole (so an edit
/// reaches the pod) and the flag naming its file; unset, none of them.
#[test]
fn the_attestation_policy_is_a_configmap_the_server_is_pointed_at() -> Result<()> {
    const POLICY: &str = "classes:\n  secure:\n    require: nitrotpm\n    measurements: [m]\n";
    let docs = template(
        NAMESPACE,
        &["--set-string", &format!("attestation.policy={POLICY}")],
    )?;
    let policy = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-attestation"))
        })
        .context("no attestation ConfigMap")?;
    assert_eq!(
        policy["data"]["policy.yaml"].as_str().map(str::trim_end),
        Some(POLICY.trim_end())
    );
    let flag = "--attestation-policy=/etc/autonode/attestation/policy.yaml";
    assert!(args(&docs)?.iter().any(|a| a == flag), "{:?}", args(&docs)?);
    let mounts = container(&docs)?["volumeMounts"]
        .as_array()
        .context("mounts")?;
    let mount = mounts
        .iter()
        .find(|m| m["name"] == "attestation-policy")
        .context("no mount")?;
    assert_eq!(mount["mountPath"], "/etc/autonode/attestation");
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees an edit"
    );
    let pod = &only(&docs, "Deployment")?["spec"]["template"]["spec"];
    let volume = pod["volumes"].as_array().context("volumes")?.iter();
    let volume = volume
        .clone()
        .find(|v| v["name"] == "attestation-policy")
        .context("no volume")?;
    assert_eq!(volume["configMap"]["name"], policy["metadata"]["name"]);

    let plain = template(NAMESPACE, &[])?;
    assert!(!args(&plain)?
        .iter()
        .any(|a| a.starts_with("--attestation-policy")));
    assert!(!plain.iter().any(|d| d["kind"] == "ConfigMap"));
    Ok(())
}
