//! Tests of [`super::parse`]: shape, versions, typed parse and every
//! validation rule. Each refusal case notes whether Debian's
//! `ignition-validate` 2.14 (specs 3.0–3.3) refuses it too.

use super::*;
use serde_json::{json, Value};

const HI_SHA256: &str = "sha256-8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4";

fn with(version: &str, rest: Value) -> Value {
    let mut config = rest;
    config["ignition"] = json!({"version": version});
    config
}

fn refused(config: Value) -> SpecError {
    match parse(&config) {
        Ok(parsed) => panic!("{config} was accepted as {parsed:?}"),
        Err(e) => e,
    }
}

#[test]
fn butane_like_config_parses() {
    let config = parse(&json!({
        "ignition": {"version": "3.4.0"},
        "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"], "groups": ["wheel"],
                              "shouldExist": true, "uid": 1000, "homeDir": "/home/core"}],
                   "groups": [{"name": "wheel", "gid": 10, "system": true}]},
        "storage": {
            "files": [{"path": "/etc/x", "mode": 420, "contents": {"source": "data:,hi"}, "user": {"id": 0},
                       "group": {"name": "wheel"}}],
            "directories": [{"path": "/etc/d", "mode": 493}],
            "links": [{"path": "/etc/l", "target": "/etc/x"}]
        },
        "systemd": {"units": [{"name": "a.service", "enabled": true, "contents": "[Unit]\nDescription=a\n",
                                "dropins": [{"name": "10.conf", "contents": "[Service]\n"}]}]}
    }))
    .unwrap();
    assert_eq!(config.storage.files[0].mode, Some(420));
    assert_eq!(config.storage.files[0].group.name.as_deref(), Some("wheel"));
    assert_eq!(config.systemd.units[0].dropins.len(), 1);
    assert_eq!(config.passwd.users[0].ssh_authorized_keys.len(), 1);
    assert_eq!(config.passwd.users[0].should_exist, Some(true));
    assert_eq!(config.passwd.groups[0].gid, Some(10));
}

/// What Go's encoding/json writes for unused sections: all "not set".
#[test]
fn go_marshalled_empties_are_not_set() {
    let config = parse(&json!({
        "ignition": {"version": "3.2.0", "config": {"replace": {"verification": {}}, "merge": []},
                     "proxy": {}, "security": {"tls": {}}, "timeouts": {}},
        "passwd": {},
        "kernelArguments": {},
        "storage": {"disks": [], "files": [{"path": "/a", "user": {}, "contents": {"verification": {}},
                                            "append": [], "mode": null}]},
        "systemd": {"units": [{"name": "a.service", "dropins": null}]}
    }))
    .unwrap();
    assert_eq!(config.storage.files[0].user, OwnerId::default());
    assert!(config.systemd.units[0].dropins.is_empty());
}

#[test]
fn unsupported_sections_are_named() {
    // ignition-validate accepts all of these (they are Ignition features);
    // autonode refuses each by name rather than ignore it.
    let cases = [
        (
            json!({"storage": {"disks": [{"device": "/dev/sda"}]}}),
            "storage.disks",
        ),
        (
            json!({"storage": {"filesystems": [{"device": "/dev/sda"}]}}),
            "storage.filesystems",
        ),
        (
            json!({"storage": {"raid": [{"name": "r"}]}}),
            "storage.raid",
        ),
        (
            json!({"storage": {"luks": [{"name": "l"}]}}),
            "storage.luks",
        ),
        (
            json!({"kernelArguments": {"shouldExist": ["a"]}}),
            "kernelArguments",
        ),
        (
            json!({"ignition": {"config": {"merge": [{"source": "https://x"}]}}}),
            "ignition.config",
        ),
        (
            json!({"ignition": {"config": {"replace": {"source": "https://x"}}}}),
            "ignition.config",
        ),
        (
            json!({"ignition": {"proxy": {"httpProxy": "http://p"}}}),
            "ignition.proxy",
        ),
        (
            json!({"ignition": {"security": {"tls": {"certificateAuthorities": [{"source": "data:,x"}]}}}}),
            "ignition.security",
        ),
        (
            json!({"storage": {"files": [{"path": "/x", "append": [{"source": "data:,x"}]}]}}),
            "storage.files[0].append",
        ),
        (
            json!({"storage": {"files": [{"path": "/x", "contents": {"source": "https://e/x"}}]}}),
            "storage.files[0].contents.source (https",
        ),
        (
            json!({"storage": {"files": [{"path": "/x", "contents": {"httpHeaders": [{"name": "a"}]}}]}}),
            "storage.files[0].contents.httpHeaders",
        ),
        (
            json!({"storage": {"links": [{"path": "/x", "target": "/y", "hard": true}]}}),
            "storage.links[0].hard",
        ),
        (
            json!({"storage": {"files": [{"path": "/x", "mdoe": 420}]}}),
            "storage.files[0].mdoe",
        ),
    ];
    for (config, named) in cases {
        let mut config = config;
        let ignition = config["ignition"].as_object().cloned().unwrap_or_default();
        config["ignition"] = json!(ignition);
        config["ignition"]["version"] = json!("3.4.0");
        let err = refused(config).to_string();
        assert!(err.starts_with(named), "{err} should name {named}");
        assert!(err.contains("does not support"), "{err}");
    }
}

#[test]
fn versions() {
    for version in ["3.0.0", "3.1.0", "3.5.0", "3.6.0"] {
        assert!(parse(&with(version, json!({}))).is_ok(), "{version}");
    }
    // ignition-validate refuses 3.+1.0 and -experimental too; it accepts
    // 03.1.0 and 3.01.0, which autonode refuses (not canonical).
    let bad = [
        "2.3.0",
        "3.7.0",
        "3.5.0-experimental",
        "3.1.0-experimental",
        "",
        "3.+1.0",
        "03.1.0",
        "3.01.0",
        "3.1",
        "3.1.0.0",
        "3. 1.0",
        "3.1.00",
        "+3.1.0",
    ];
    for version in bad {
        assert_eq!(
            parse(&with(version, json!({}))),
            Err(SpecError::Version(version.into())),
            "{version}"
        );
    }
    assert!(matches!(parse(&json!({})), Err(SpecError::Version(_))));
    assert!(matches!(
        parse(&json!({"ignition": {"version": 3}})),
        Err(SpecError::Version(_))
    ));
}

#[test]
fn fields_newer_than_the_config_version_are_refused() {
    // ignition-validate: "Unused key shouldExist" under 3.0/3.1 (ignored);
    // "unrecognized hash function" for sha256 under 3.0.
    let user = json!({"passwd": {"users": [{"name": "a", "shouldExist": false}]}});
    assert!(parse(&with("3.2.0", user.clone())).is_ok());
    let err = refused(with("3.1.0", user));
    assert_eq!(
        err.to_string(),
        "passwd.users[0].shouldExist: needs Ignition spec 3.2.0 or newer, but the config says 3.1.0"
    );
    let group = json!({"passwd": {"groups": [{"name": "a", "shouldExist": false}]}});
    assert!(matches!(
        refused(with("3.0.0", group)),
        SpecError::TooNew { since: 2, .. }
    ));
    let sha256 = json!({"storage": {"files": [{"path": "/a", "contents": {"source": "data:,hi",
                        "verification": {"hash": HI_SHA256}}}]}});
    assert!(parse(&with("3.1.0", sha256.clone())).is_ok());
    assert!(matches!(
        refused(with("3.0.0", sha256)),
        SpecError::TooNew { since: 1, .. }
    ));
}

#[test]
fn type_errors_name_the_entry() {
    let cases = [
        (
            json!({"storage": {"files": [{"mode": 420}]}}),
            "storage.files[0]: missing field `path`",
        ),
        (
            json!({"storage": {"files": [{"path": "/a", "mode": -1}]}}),
            "storage.files[0]: invalid value",
        ),
        (
            json!({"storage": {"files": {"path": "/a"}}}),
            "storage.files: must be a list",
        ),
        (json!({"storage": 5}), "storage: must be an object"),
        (
            json!({"systemd": {"units": [{"name": "a.service", "dropins": [{"contents": "x"}]}]}}),
            "systemd.units[0].dropins[0]: missing field `name`",
        ),
        (
            json!({"passwd": {"users": [{"name": "a", "uid": "1"}]}}),
            "passwd.users[0]: invalid type",
        ),
    ];
    for (config, want) in cases {
        let err = refused(with("3.3.0", config)).to_string();
        assert!(err.starts_with(want), "{err} should start with {want}");
    }
}

/// Each case: the config's storage/systemd/passwd, the expected message
/// start. All are refused by ignition-validate 2.14 too, unless noted.
#[test]
fn validation_rules() {
    let file = |entry: Value| json!({"storage": {"files": [entry]}});
    let unit = |entry: Value| json!({"systemd": {"units": [entry]}});
    let cases = [
        (
            file(json!({"path": "/a", "contents": {"source": "data:;base64,aGk%0A="}})),
            "storage.files[0].contents.source: bad base64",
        ),
        (
            file(json!({"path": "/a", "contents": {"source": "data:;base64,a$Gk="}})),
            "storage.files[0].contents.source: bad base64",
        ),
        (
            file(json!({"path": "/a", "contents": {"source": "data:,%zz"}})),
            "storage.files[0].contents.source: bad %-escape",
        ),
        (
            file(json!({"path": "/a", "contents": {"source": "data:,hi", "compression": "xz"}})),
            "storage.files[0].contents.compression: unknown compression \"xz\"",
        ),
        (
            file(json!({"path": "/a", "contents": {"compression": "xz"}})),
            "storage.files[0].contents.compression",
        ),
        (
            file(
                json!({"path": "/a", "contents": {"source": "data:,hi", "verification": {"hash": "sha256-00"}}}),
            ),
            "storage.files[0].contents.verification.hash: sha256 digest must be 64",
        ),
        (
            file(
                json!({"path": "/a", "contents": {"source": "data:,hi", "verification": {"hash": "md5-00"}}}),
            ),
            "storage.files[0].contents.verification.hash: unsupported hash",
        ),
        // ignition-validate does not compute the hash; Ignition fails on the node.
        (
            file(
                json!({"path": "/a", "contents": {"source": "data:,ho", "verification": {"hash": HI_SHA256}}}),
            ),
            "storage.files[0].contents.verification.hash: hash mismatch",
        ),
        (
            file(json!({"path": "a"})),
            "storage.files[0].path: \"a\" must be an absolute path",
        ),
        (
            file(json!({"path": "/a/../b"})),
            "storage.files[0].path: \"/a/../b\" must be fully simplified",
        ),
        (file(json!({"path": "/a/./b"})), "storage.files[0].path"),
        (file(json!({"path": "/a//b"})), "storage.files[0].path"),
        (file(json!({"path": "/a/"})), "storage.files[0].path"),
        (
            json!({"storage": {"files": [{"path": "/a"}], "links": [{"path": "/a", "target": "/b"}]}}),
            "storage.links[0]: path \"/a\" appears more than once (first at storage.files[0])",
        ),
        (
            json!({"storage": {"directories": [{"path": "/d"}, {"path": "/d"}]}}),
            "storage.directories[1]: path \"/d\" appears more than once",
        ),
        (
            json!({"storage": {"links": [{"path": "/l", "target": ""}]}}),
            "storage.links[0].target",
        ),
        (
            json!({"storage": {"files": [{"path": "/etc/dir/file"}], "links": [{"path": "/etc/dir", "target": "/tmp"}]}}),
            "storage.files[0].path: \"/etc/dir/file\" is under storage.links[0].path (\"/etc/dir\"), a link",
        ),
        (
            json!({"storage": {"directories": [{"path": "/x/y/z"}], "links": [{"path": "/a", "target": "/"}, {"path": "/x", "target": "/"}]}}),
            "storage.directories[0].path: \"/x/y/z\" is under storage.links[1].path",
        ),
        (
            json!({"storage": {"links": [{"path": "/l/m", "target": "/t"}, {"path": "/l", "target": "/t"}]}}),
            "storage.links[0].path: \"/l/m\" is under storage.links[1].path",
        ),
        (
            unit(json!({"name": "a"})),
            "systemd.units[0].name: \"a\" is not a unit name",
        ),
        (unit(json!({"name": "a.foo"})), "systemd.units[0].name"),
        (unit(json!({"name": ".service"})), "systemd.units[0].name"), // ignition-validate accepts
        (
            unit(json!({"name": "a/b.service"})),
            "systemd.units[0].name: \"a/b.service\" must not contain '/'",
        ), // accepted by ignition-validate
        (
            json!({"systemd": {"units": [{"name": "a.service"}, {"name": "a.service"}]}}),
            "systemd.units[1]: unit \"a.service\" appears more than once",
        ),
        (
            unit(json!({"name": "a.service", "dropins": [{"name": "x"}]})),
            "systemd.units[0].dropins[0].name: \"x\" is not a drop-in name",
        ),
        (
            unit(json!({"name": "a.service", "dropins": [{"name": "a/b.conf"}]})),
            "systemd.units[0].dropins[0].name",
        ), // accepted by ignition-validate
        (
            unit(json!({"name": "a.service", "dropins": [{"name": "x.conf"}, {"name": "x.conf"}]})),
            "systemd.units[0].dropins[1]: drop-in \"x.conf\" appears more than once",
        ),
        (
            unit(json!({"name": "a.service", "mask": true, "contents": "[Unit]\n"})),
            "systemd.units[0]: a masked unit cannot have contents",
        ), // accepted by ignition-validate
        (
            unit(json!({"name": "a.service", "contents": "[Unit]\nFoo"})),
            "systemd.units[0].contents: line 2",
        ),
        (
            unit(json!({"name": "a.service", "contents": "garbage"})),
            "systemd.units[0].contents: line 1",
        ), // accepted by ignition-validate
        (
            unit(
                json!({"name": "a.service", "dropins": [{"name": "x.conf", "contents": "[Service]\nbad"}]}),
            ),
            "systemd.units[0].dropins[0].contents: line 2",
        ),
        (
            file(json!({"path": "/a", "overwrite": true})),
            "storage.files[0]: overwrite is true but there is no contents.source",
        ),
        (
            file(json!({"path": "/a", "mode": 4096})),
            "storage.files[0].mode: mode 0o10000 is out of range",
        ),
        (
            json!({"storage": {"directories": [{"path": "/d", "mode": 65535}]}}),
            "storage.directories[0].mode",
        ),
        (
            file(json!({"path": "/a", "user": {"id": 1, "name": "x"}})),
            "storage.files[0].user: set either id or name, not both",
        ),
        (
            json!({"storage": {"links": [{"path": "/l", "target": "/t", "group": {"id": 1, "name": "x"}}]}}),
            "storage.links[0].group: set either id or name",
        ),
        // User and group names: ignition-validate accepts; useradd fails.
        (
            json!({"passwd": {"users": [{"name": ""}]}}),
            "passwd.users[0].name: \"\" is not a valid user",
        ),
        (
            json!({"passwd": {"users": [{"name": "a b"}]}}),
            "passwd.users[0].name",
        ),
        (
            json!({"passwd": {"users": [{"name": "-a"}]}}),
            "passwd.users[0].name",
        ),
        (
            json!({"passwd": {"users": [{"name": "a:b"}]}}),
            "passwd.users[0].name",
        ),
        (
            json!({"passwd": {"users": [{"name": "a".repeat(33)}]}}),
            "passwd.users[0].name",
        ),
        (
            json!({"passwd": {"users": [{"name": "a", "groups": ["ok", "no/pe"]}]}}),
            "passwd.users[0].groups[1]",
        ),
        (
            json!({"passwd": {"users": [{"name": "a", "primaryGroup": "1x"}]}}),
            "passwd.users[0].primaryGroup",
        ),
        (
            json!({"passwd": {"users": [{"name": "a", "homeDir": "rel"}]}}),
            "passwd.users[0].homeDir",
        ),
        (
            file(json!({"path": "/a", "user": {"name": "no such/name"}})),
            "storage.files[0].user.name",
        ),
        (
            json!({"passwd": {"users": [{"name": "a"}, {"name": "a"}]}}),
            "passwd.users[1]: user \"a\" appears more than once",
        ),
        (
            json!({"passwd": {"groups": [{"name": "g"}, {"name": "g"}]}}),
            "passwd.groups[1]: group \"g\" appears more than once",
        ),
    ];
    for (config, want) in cases {
        let err = refused(with("3.3.0", config.clone())).to_string();
        assert!(
            err.starts_with(want),
            "{config}:\n  {err}\nshould start with\n  {want}"
        );
    }
}

#[test]
fn valid_edge_cases_are_accepted() {
    // Each accepted by ignition-validate 2.14 too.
    let config = parse(&with("3.3.0", json!({
        "passwd": {"users": [{"name": "_svc$"}, {"name": "Admin.x-1"}], "groups": [{"name": "_svc$"}]},
        "storage": {
            "files": [{"path": "/empty", "overwrite": true, "contents": {"source": ""}},
                      {"path": "/setuid", "mode": 0o4755},
                      {"path": "/upper", "contents": {"source": "data:,hi",
                       "verification": {"hash": HI_SHA256.to_uppercase().replace("SHA256", "sha256")}}},
                      {"path": "/plain", "contents": {"source": "data:,x", "compression": ""}}],
            "directories": [{"path": "/"}],
            // A sibling sharing a prefix is not under the link.
            "links": [{"path": "/rel", "target": "relative/target"},
                      {"path": "/setu", "target": "/setuid"}]
        },
        "systemd": {"units": [{"name": "a@.service", "contents": "# c\n[Unit]\nDescription=a \\\n  b\n\n[Install]\nWantedBy=multi-user.target\n"},
                              {"name": "b.service", "mask": true},
                              {"name": "c.timer", "dropins": [{"name": "10-x.conf"}]}]}
    })))
    .unwrap();
    assert_eq!(config.storage.files[0].contents.source.as_deref(), Some(""));
    assert_eq!(config.storage.files[1].mode, Some(0o4755));
}

#[test]
fn serialising_a_parsed_config_gives_it_back() {
    let original = json!({
        "ignition": {"version": "3.2.0"},
        "passwd": {"users": [{"name": "core", "passwordHash": "$6$x", "sshAuthorizedKeys": ["k"], "uid": 1000,
                              "gecos": "Core", "homeDir": "/home/core", "noCreateHome": false,
                              "primaryGroup": "core", "groups": ["wheel"], "noUserGroup": true,
                              "noLogInit": true, "shell": "/bin/bash", "system": false, "shouldExist": true}],
                   "groups": [{"name": "wheel", "gid": 10, "passwordHash": "*", "system": true, "shouldExist": true}]},
        "storage": {
            "files": [{"path": "/etc/x", "mode": 420, "overwrite": true, "user": {"id": 0},
                       "group": {"name": "wheel"},
                       "contents": {"source": "data:,hi", "verification": {"hash": HI_SHA256}}},
                      {"path": "/etc/empty"}],
            "directories": [{"path": "/etc/d", "mode": 493, "group": {"id": 5}}],
            "links": [{"path": "/etc/l", "target": "/etc/x", "hard": false}]
        },
        "systemd": {"units": [{"name": "a.service", "enabled": true, "mask": false, "contents": "[Unit]\n",
                                "dropins": [{"name": "10.conf", "contents": "[Service]\n"}]}]}
    });
    let config = parse(&original).unwrap();
    let written = serde_json::to_value(&config).unwrap();
    assert_eq!(
        written, original,
        "nothing unset is written, nothing set is lost"
    );
    assert_eq!(parse(&written).unwrap(), config);
    let empty = serde_json::to_value(parse(&with("3.0.0", json!({"passwd": {}}))).unwrap());
    assert_eq!(empty.unwrap(), json!({"ignition": {"version": "3.0.0"}}));
}

/// Arbitrary JSON never panics the parser (a cheap fuzz over shapes).
#[test]
fn odd_values_never_panic() {
    let odd = [
        json!(null),
        json!(1),
        json!("x"),
        json!([]),
        json!({}),
        json!([{}]),
        json!({"a": 1}),
        json!(true),
    ];
    let places = ["storage", "passwd", "systemd", "ignition"];
    for place in places {
        for value in &odd {
            let _ = parse(&json!({"ignition": {"version": "3.3.0"}, place: value}));
            for key in ["files", "units", "users", "links", "directories", "groups"] {
                let _ = parse(&json!({"ignition": {"version": "3.3.0"}, place: {key: value}}));
                let _ = parse(&json!({"ignition": {"version": "3.3.0"}, place: {key: [value]}}));
            }
        }
    }
}
