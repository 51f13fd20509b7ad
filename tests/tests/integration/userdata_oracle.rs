//! userData as cloud-init reads it: for each shape an operator may write
//! (Karpenter's AL2 and AL2023 examples, Terraform's and cloud-init's own
//! MIME output, scripts, cloud-configs, Bottlerocket and Ignition
//! userData, gzip, base64, nested multiparts), the parts and types the
//! agent's userdata module finds must be the ones cloud-init's own
//! user-data processing finds (tests/userdata/cloudinit_parts.py), and the
//! agent's config must be the text of cloud-init's autonode part.
//!
//! cloud-init is required, not optional: tests/setup/install-deps installs
//! it, and without it this test fails.

use autonode_agent::userdata::{self, Extracted, Part};
use base64::Engine as _;
use std::io::Write as _;
use std::path::Path;
use std::process::Command;

/// Debian's interpreter, the one cloud-init's package installs into.
const PYTHON: &str = "/usr/bin/python3";
const CONFIG: &str = "server-url = \"https://10.0.0.1:8443\"\n\
    server-ca-sha256 = \"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"\n\
    cluster-name = \"prod-1\"\n";

/// One userData and the agent config it holds, if any.
struct Case {
    name: &'static str,
    raw: Vec<u8>,
    config: Option<&'static str>,
}

fn case(name: &'static str, raw: impl Into<Vec<u8>>, config: Option<&'static str>) -> Case {
    Case {
        name,
        raw: raw.into(),
        config,
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A trimmed CONFIG: a part's last line break belongs to its delimiter.
fn trimmed() -> &'static str {
    CONFIG.trim_end()
}

/// The shapes as their authors' tools and docs write them (our own
/// examples in those styles).
fn documented_cases() -> Vec<Case> {
    let al2023 = format!(
        "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"//\"\n\n\
         --//\nContent-Type: application/node.eks.aws\n\n---\napiVersion: node.eks.aws/v1alpha1\n\
         kind: NodeConfig\nspec:\n  kubelet:\n    config:\n      maxPods: 42\n\
         --//\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\n\n#!/bin/bash\necho \"node up\"\n\
         --//\nContent-Type: application/x-autonode-config\n\n{CONFIG}\n--//\n"
    );
    let al2 = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"BOUNDARY\"\n\n\
         --BOUNDARY\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\n\n\
         #!/bin/bash\necho \"custom step\"\n\n--BOUNDARY--\n";
    let terraform = format!(
        "Content-Type: multipart/mixed; boundary=\"MIMEBOUNDARY\"\nMIME-Version: 1.0\n\
         --MIMEBOUNDARY\r\nContent-Transfer-Encoding: 7bit\r\nContent-Type: application/x-autonode-config\r\n\
         Mime-Version: 1.0\r\n\r\n{CONFIG}\r\n--MIMEBOUNDARY\r\nContent-Transfer-Encoding: 7bit\r\n\
         Content-Type: text/x-shellscript\r\nMime-Version: 1.0\r\n\r\n#!/bin/sh\ntrue\r\n--MIMEBOUNDARY--\r\n"
    );
    vec![
        case("karpenter-al2023-unclosed", al2023, Some(CONFIG)),
        case("karpenter-al2-script-only", al2, None),
        case("terraform-no-blank-line", terraform, Some(CONFIG)),
    ]
}

/// userData that is not the agent's, and plain forms of the agent's.
fn whole_cases() -> Vec<Case> {
    vec![
        case("toml", CONFIG, Some(CONFIG)),
        case("toml-gzip", gzip(CONFIG.as_bytes()), Some(CONFIG)),
        case("empty", "", None),
        case("script", "#!/bin/bash\necho hi\n", None),
        case("script-without-shebang", "echo hello > /tmp/x\n", None),
        case(
            "cloud-config",
            "#cloud-config\nruncmd:\n  - [touch, /x]\n",
            None,
        ),
        case(
            "bottlerocket",
            "[settings.kubernetes]\napi-server = \"https://x\"\ncluster-name = \"c\"\n",
            None,
        ),
        case(
            "ignition",
            r#"{"ignition": {"version": "3.4.0"}, "storage": {}}"#,
            None,
        ),
        case(
            "boothook-gzip",
            gzip(b"  #cloud-boothook\necho early\n"),
            None,
        ),
    ]
}

/// MIME forms: encodings, compression, nesting, sniffing.
fn mime_cases() -> Vec<Case> {
    let head = |boundary: &str| {
        format!("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{boundary}\"\n\npreamble\n")
    };
    let base64_part = format!(
        "{}--b\nContent-Type: text/cloud-config\n\n#cloud-config\n{{}}\n\
         --b\nContent-Type: application/x-autonode-config; charset=\"utf-8\"\nContent-Transfer-Encoding: base64\n\n{}\n--b--\n",
        head("b"),
        b64(CONFIG.as_bytes())
    );
    let nested = format!(
        "{}--outer\nContent-Type: multipart/alternative; boundary=inner\n\n--inner\n\
         Content-Type: text/plain\n\n#!/bin/sh\necho sniffed\n--inner\nContent-Type: text/x-autonode-config\n\n\
         {}\n--inner--\n--outer\nContent-Type: text/x-shellscript\n\n#cloud-config\n{{}}\n--outer--\n",
        head("outer"),
        trimmed()
    );
    let gzip_part = format!(
        "{}--g\nContent-Type: application/x-gzip\nContent-Transfer-Encoding: base64\n\n{}\n--g--\n",
        head("g"),
        b64(&gzip(b"#cloud-config\npackages: [jq]\n"))
    );
    let quoted_printable = format!(
        "{}--q\nContent-Type: text/x-autonode-config\nContent-Transfer-Encoding: quoted-printable\n\n\
         server-url =3D \"https://10.0.0.1:8443\"\nserver-ca-sha256 =3D \"0011223344556677=\n\
         8899aabbccddeeff00112233445566778899aabbccddeeff\"\ncluster-name =3D \"prod-1\"\n--q--\n",
        head("q")
    );
    let crlf = head("c").replace('\n', "\r\n")
        + &format!(
            "--c\r\nContent-Type: application/x-autonode-config\r\n\r\n{}\r\n--c--\r\n",
            trimmed()
        );
    vec![
        case("mime-base64-part", base64_part, Some(CONFIG)),
        case("mime-nested", nested, Some(trimmed())),
        case("mime-gzip-part", gzip_part, None),
        case("mime-quoted-printable", quoted_printable, Some(trimmed())),
        case(
            "mime-crlf-gzip-whole",
            gzip(crlf.as_bytes()),
            Some(trimmed()),
        ),
        case(
            "mime-no-boundary",
            "MIME-Version: 1.0\nContent-Type: multipart/mixed\n\n--b\n\nx\n",
            None,
        ),
    ]
}

/// What `cloud-init devel make-mime` itself writes, with the one autonode
/// type it can write.
fn make_mime_case(dir: &Path) -> Case {
    let config = dir.join("agent.toml");
    let script = dir.join("script.sh");
    std::fs::write(&config, CONFIG).unwrap();
    std::fs::write(&script, "#!/bin/sh\necho from make-mime\n").unwrap();
    let output = Command::new(PYTHON)
        .args([
            "-m",
            "cloudinit.cmd.main",
            "devel",
            "make-mime",
            "--force",
            "-a",
        ])
        .arg(format!("{}:x-autonode-config", config.display()))
        .arg("-a")
        .arg(format!("{}:x-shellscript", script.display()))
        .output()
        .expect("running cloud-init devel make-mime");
    assert!(
        output.status.success(),
        "cloud-init devel make-mime failed (is cloud-init installed? tests/setup/install-deps): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    case("cloud-init-make-mime", output.stdout, Some(CONFIG))
}

/// cloud-init's parts for each userData, by running its own code.
fn cloud_init_parts(dir: &Path, cases: &[Case]) -> Vec<Result<Vec<Part>, String>> {
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("userdata/cloudinit_parts.py");
    let mut command = Command::new(PYTHON);
    command.arg(&driver);
    for (i, case) in cases.iter().enumerate() {
        let path = dir.join(format!("{i}.userdata"));
        std::fs::write(&path, &case.raw).unwrap();
        command.arg(path);
    }
    let output = command.output().expect("running python3");
    assert!(
        output.status.success(),
        "cloud-init's user-data processing could not run (cloud-init is required: \
         tests/setup/install-deps installs it): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), cases.len(), "{stdout}");
    lines.into_iter().map(parse_driver_line).collect()
}

fn parse_driver_line(line: &str) -> Result<Vec<Part>, String> {
    let value: serde_json::Value = serde_json::from_str(line).unwrap();
    if let Some(error) = value.get("error") {
        return Err(error.to_string());
    }
    let parts = value["parts"].as_array().unwrap();
    Ok(parts
        .iter()
        .map(|part| Part {
            content_type: part["type"].as_str().unwrap().to_string(),
            payload: base64::engine::general_purpose::STANDARD
                .decode(part["payload"].as_str().unwrap())
                .unwrap(),
        })
        .collect())
}

fn show(parts: &[Part]) -> Vec<(String, String)> {
    parts
        .iter()
        .map(|p| {
            (
                p.content_type.clone(),
                String::from_utf8_lossy(&p.payload).into_owned(),
            )
        })
        .collect()
}

#[test]
fn the_agent_reads_user_data_as_cloud_init_does() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases = documented_cases();
    cases.extend(whole_cases());
    cases.extend(mime_cases());
    cases.push(make_mime_case(dir.path()));
    let oracle = cloud_init_parts(dir.path(), &cases);
    for (case, cloud_init) in cases.iter().zip(oracle) {
        let cloud_init =
            cloud_init.unwrap_or_else(|e| panic!("{}: cloud-init refused it: {e}", case.name));
        let ours = userdata::parts(&case.raw).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(
            show(&ours.parts),
            show(&cloud_init),
            "{}: parts differ (left: autonode, right: cloud-init)",
            case.name
        );
        assert_eq!(
            ours.parts, cloud_init,
            "{}: payload bytes differ",
            case.name
        );

        let autonode_parts: Vec<&Part> = cloud_init
            .iter()
            .filter(|p| userdata::is_autonode_type(&p.content_type))
            .collect();
        let extracted =
            userdata::extract(&case.raw).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        match (&extracted, case.config) {
            (Extracted::Config(text), Some(expected)) => {
                assert_eq!(text, expected, "{}", case.name);
                // Through MIME, it is cloud-init's part, word for word.
                if ours.mime {
                    assert_eq!(autonode_parts.len(), 1, "{}", case.name);
                    assert_eq!(text.as_bytes(), autonode_parts[0].payload, "{}", case.name);
                }
            }
            (Extracted::Elsewhere(found), None) => {
                assert!(autonode_parts.is_empty(), "{}: {found}", case.name);
            }
            (other, expected) => {
                panic!("{}: extracted {other:?}, expected {expected:?}", case.name)
            }
        }
    }
}
