//! Applying an Ignition config into a temp root: every supported entry,
//! refusals by name, and a re-run that changes nothing.

use autonode_agent::fsutil::Root;
use autonode_agent::ignition::{self, IgnitionError};
use base64::Engine as _;
use serde_json::json;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

fn gzip_data_url(text: &str) -> String {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(text.as_bytes()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(encoder.finish().unwrap());
    format!("data:;base64,{b64}")
}

fn config() -> serde_json::Value {
    json!({
        "ignition": {"version": "3.4.0"},
        "storage": {
            "directories": [{"path": "/var/lib/app", "mode": 448, "user": {"id": 1000}, "group": {"id": 1000}}],
            "files": [
                {"path": "/etc/app/plain.conf", "mode": 420, "contents": {"source": "data:,hello%20world%0A"}},
                {"path": "/etc/app/packed.conf", "mode": 384, "overwrite": true,
                 "contents": {"source": gzip_data_url("compressed\n"), "compression": "gzip"}},
                {"path": "/etc/app/empty"}
            ],
            "links": [{"path": "/etc/app/link", "target": "/etc/app/plain.conf"}]
        },
        "systemd": {"units": [
            {"name": "app.service", "enabled": true,
             "contents": "[Unit]\nDescription=app\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n",
             "dropins": [{"name": "10-env.conf", "contents": "[Service]\nEnvironment=A=1\n"}]},
            {"name": "kubelet.service", "enabled": true,
             "contents": "[Service]\nExecStart=/usr/bin/kubelet\n[Install]\nWantedBy=multi-user.target\n"},
            {"name": "unwanted.service", "mask": true}
        ]}
    })
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn applies_everything_and_a_rerun_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::new(dir.path());
    let applied = ignition::apply(&root, &config()).unwrap();
    assert!(applied.changed >= 8, "{applied:?}");
    assert_eq!(applied.enabled_units, ["app.service", "kubelet.service"]);

    let at = |p: &str| dir.path().join(p.trim_start_matches('/'));
    assert_eq!(
        std::fs::read_to_string(at("/etc/app/plain.conf")).unwrap(),
        "hello world\n"
    );
    assert_eq!(mode(&at("/etc/app/plain.conf")), 0o644);
    assert_eq!(
        std::fs::read_to_string(at("/etc/app/packed.conf")).unwrap(),
        "compressed\n"
    );
    assert_eq!(mode(&at("/etc/app/packed.conf")), 0o600);
    assert_eq!(std::fs::read(at("/etc/app/empty")).unwrap(), b"");
    assert_eq!(mode(&at("/var/lib/app")), 0o700);
    assert_eq!(std::fs::metadata(at("/var/lib/app")).unwrap().uid(), 1000);
    assert_eq!(
        std::fs::read_link(at("/etc/app/link")).unwrap(),
        Path::new("/etc/app/plain.conf")
    );
    assert_eq!(
        std::fs::read_link(at(
            "/etc/systemd/system/multi-user.target.wants/app.service"
        ))
        .unwrap(),
        Path::new("/etc/systemd/system/app.service")
    );
    assert!(at("/etc/systemd/system/app.service.d/10-env.conf").is_file());
    assert_eq!(
        std::fs::read_link(at("/etc/systemd/system/unwanted.service")).unwrap(),
        Path::new("/dev/null")
    );

    let again = ignition::apply(&root, &config()).unwrap();
    assert_eq!(again.changed, 0, "a re-run must change nothing");
}

#[test]
fn disabling_removes_the_wants_link() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::new(dir.path());
    ignition::apply(&root, &config()).unwrap();
    let disable = json!({"ignition": {"version": "3.4.0"},
                         "systemd": {"units": [{"name": "app.service", "enabled": false}]}});
    let applied = ignition::apply(&root, &disable).unwrap();
    assert_eq!(applied.changed, 1);
    assert!(std::fs::symlink_metadata(
        dir.path()
            .join("etc/systemd/system/multi-user.target.wants/app.service")
    )
    .is_err());
}

#[test]
fn existing_file_with_other_contents_needs_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::new(dir.path());
    std::fs::create_dir_all(dir.path().join("etc/app")).unwrap();
    std::fs::write(dir.path().join("etc/app/plain.conf"), "local edit").unwrap();
    let err = ignition::apply(&root, &config()).unwrap_err();
    assert!(matches!(err, IgnitionError::Conflict { .. }), "{err}");
    assert!(err.to_string().contains("/etc/app/plain.conf"), "{err}");
}

#[test]
fn unsupported_sections_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::new(dir.path());
    // A config that also asks for a disk: refused by the field's path, and
    // its files (valid on their own) are not written.
    let mut with_disks = config();
    with_disks["storage"]["disks"] = json!([{"device": "/dev/xvdb", "wipeTable": true}]);
    let err = ignition::apply(&root, &with_disks).unwrap_err();
    assert!(err.is_refusal());
    assert!(err.to_string().contains("storage.disks"), "{err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );

    let remote = json!({"ignition": {"version": "3.4.0"},
        "storage": {"files": [{"path": "/x", "contents": {"source": "s3://bucket/x"}}]}});
    let err = ignition::apply(&root, &remote).unwrap_err();
    assert!(
        err.to_string().contains("storage.files[0].contents.source"),
        "{err}"
    );

    let escape = json!({"ignition": {"version": "3.4.0"},
        "storage": {"files": [{"path": "/../../etc/shadow", "contents": {"source": "data:,x"}}]}});
    assert!(ignition::apply(&root, &escape).is_err());
}

#[test]
fn hash_mismatch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = json!({"ignition": {"version": "3.4.0"},
        "storage": {"files": [{"path": "/x", "contents": {"source": "data:,hello",
            "verification": {"hash": "sha256-0000000000000000000000000000000000000000000000000000000000000000"}}}]}});
    let err = ignition::apply(&Root::new(dir.path()), &bad).unwrap_err();
    assert!(err.to_string().contains("hash mismatch"), "{err}");
}
