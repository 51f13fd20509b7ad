//! Starting kubelet (and the units Ignition enabled) through systemd, with
//! a `systemctl daemon-reload` only when something systemd has loaded
//! changed on disk.
//!
//! Under the package's unit the agent does not start kubelet at all: the
//! unit `Wants=kubelet.service`, so systemd queued kubelet's start behind
//! the agent's when it started the agent, and runs it when the agent
//! succeeds (`--no-start-kubelet`). Each `systemctl` is a process, half a
//! second under emulation; with no Ignition units there is none.
//!
//! A reload makes PID 1 re-read every unit on the machine: seconds on a
//! small or emulated machine, while kubelet waits. The package's kubelet
//! drop-in was loaded at boot and reads the agent's environment file when
//! kubelet starts, so kubelet itself never needs one. Two things do:
//! - units or drop-ins an Ignition config wrote ([`ignition_touches_units`]);
//! - an older agent's own drop-in ([`OLD_DROPIN`]), removed once on
//!   upgrade ([`retire_old_dropin`]).

use super::KubeletError;
use crate::fsutil::{self, Root};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

/// The drop-in agents before the package shipped one wrote themselves. It
/// sorts after the package's and would override its `ExecStart=`.
pub const OLD_DROPIN: &str = "/etc/systemd/system/kubelet.service.d/10-autonode.conf";

/// Where systemd looks for units, drop-ins and their links: anything an
/// Ignition config puts here is seen only after a reload.
const UNIT_DIRS: [&str; 5] = [
    "/etc/systemd/",
    "/run/systemd/",
    "/usr/lib/systemd/",
    "/lib/systemd/",
    "/usr/local/lib/systemd/",
];

/// Removes [`OLD_DROPIN`]; whether there was one (then systemd must reload
/// before starting kubelet, or it would still run the old `ExecStart=`).
pub fn retire_old_dropin(root: &Root) -> Result<bool, KubeletError> {
    let removed = fsutil::remove_file(&root.join(OLD_DROPIN)?)?;
    if removed {
        log::info!("removed {OLD_DROPIN}, an older agent's; the package's drop-in replaces it");
    }
    Ok(removed)
}

/// Whether an Ignition config writes anything systemd loads: a unit with
/// contents, drop-ins or a mask, or a file, link or directory under a unit
/// directory. Enabling an existing unit needs no reload (a `wants` link is
/// read at boot, and the agent starts the unit by name). Conservative: it
/// says yes whether or not this run changed the file, since a run resumed
/// after a crash rewrites nothing yet may follow a run that never reloaded.
pub fn ignition_touches_units(config: &Value) -> bool {
    let units = config["systemd"]["units"].as_array().into_iter().flatten();
    let unit_changes = units.into_iter().any(|unit| {
        unit.get("contents").is_some_and(|c| !c.is_null())
            || unit["dropins"].as_array().is_some_and(|d| !d.is_empty())
            || unit["mask"] == Value::Bool(true)
    });
    let storage = &config["storage"];
    let paths = ["files", "links", "directories"]
        .iter()
        .filter_map(|kind| storage[*kind].as_array())
        .flatten()
        .filter_map(|entry| entry["path"].as_str());
    unit_changes || paths.into_iter().any(in_unit_dir)
}

fn in_unit_dir(path: &str) -> bool {
    let dir = format!("{}/", path.trim_end_matches('/'));
    UNIT_DIRS.iter().any(|unit_dir| dir.starts_with(unit_dir))
}

/// What [`start`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// How long `systemctl daemon-reload` took, if it ran.
    pub reload: Option<Duration>,
}

/// Starts `units` (plus kubelet if `kubelet`) without waiting, after a
/// daemon-reload if `reload`: the agent's own unit is ordered before
/// kubelet, so a blocking start would wait for the agent itself.
pub fn start(
    systemctl: &str,
    units: &[String],
    reload: bool,
    kubelet: bool,
) -> Result<Started, KubeletError> {
    let reload = if reload {
        let started = Instant::now();
        run(systemctl, &["daemon-reload".to_string()])?;
        let took = started.elapsed();
        // key=value, for the VM test's timings.
        log::info!("daemon-reload took_s={:.3}", took.as_secs_f64());
        Some(took)
    } else {
        log::info!("no systemctl daemon-reload: no unit changed on disk");
        None
    };
    let mut start: Vec<String> = units
        .iter()
        .filter(|u| u.as_str() != super::UNIT)
        .cloned()
        .collect();
    // Ignition may enable kubelet itself: then the agent starts it.
    if kubelet || start.len() < units.len() {
        start.push(super::UNIT.to_string());
    }
    if start.is_empty() {
        log::info!("kubelet.service starts when the agent's unit succeeds");
    } else {
        let mut args = vec!["start".to_string(), "--no-block".to_string()];
        args.extend(start);
        run(systemctl, &args)?;
    }
    Ok(Started { reload })
}

fn run(program: &str, args: &[String]) -> Result<(), KubeletError> {
    let command = format!("{program} {}", args.join(" "));
    log::info!("running {command}");
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| KubeletError::Command {
            command: command.clone(),
            reason: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    Err(KubeletError::Command {
        command,
        reason: format!("{}: {stderr}", output.status),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A systemctl that records its arguments in `<dir>/calls`.
    fn fake_systemctl(dir: &std::path::Path) -> String {
        let script = dir.join("systemctl");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}\n",
                dir.join("calls").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        script.to_string_lossy().into_owned()
    }

    #[test]
    fn start_reloads_only_when_asked_then_starts_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let systemctl = fake_systemctl(dir.path());
        let units = ["app.service".to_string(), super::super::UNIT.to_string()];
        let started = start(&systemctl, &units, false, true).unwrap();
        assert_eq!(started.reload, None);
        let started = start(&systemctl, &units, true, true).unwrap();
        assert!(started.reload.is_some());
        // systemd starts kubelet: only Ignition's units, or nothing at all.
        start(&systemctl, &units[..1], false, false).unwrap();
        start(&systemctl, &[], false, false).unwrap();
        let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
        assert_eq!(
            calls,
            "start --no-block app.service kubelet.service\n\
             daemon-reload\nstart --no-block app.service kubelet.service\n\
             start --no-block app.service\n"
        );
        assert!(start("/nonexistent/systemctl", &[], false, true).is_err());
    }

    #[test]
    fn only_configs_that_write_what_systemd_loads_need_a_reload() {
        let quiet = [
            json!({"ignition": {"version": "3.4.0"}}),
            json!({"storage": {"files": [{"path": "/etc/cni/net.d/10-containerd-net.conflist"}]}}),
            json!({"storage": {"files": [{"path": "/etc/systemd-like/x"}]}}),
            json!({"systemd": {"units": [{"name": "containerd.service", "enabled": true}]}}),
            json!({"systemd": {"units": [{"name": "a.service", "dropins": []}]}}),
        ];
        for config in &quiet {
            assert!(!ignition_touches_units(config), "{config}");
        }
        let loud = [
            json!({"systemd": {"units": [{"name": "app.service", "contents": "[Service]\n"}]}}),
            json!({"systemd": {"units": [{"name": "kubelet.service",
                "dropins": [{"name": "x.conf", "contents": "[Service]\n"}]}]}}),
            json!({"systemd": {"units": [{"name": "apt-daily.timer", "mask": true}]}}),
            json!({"storage": {"files": [{"path": "/etc/systemd/system/app.service"}]}}),
            json!({"storage": {"links": [{"path": "/etc/systemd/system/multi-user.target.wants/a.service"}]}}),
            json!({"storage": {"directories": [{"path": "/usr/lib/systemd/system/a.service.d"}]}}),
            json!({"storage": {"directories": [{"path": "/etc/systemd"}]}}),
        ];
        for config in &loud {
            assert!(ignition_touches_units(config), "{config}");
        }
    }

    #[test]
    fn the_old_dropin_is_removed_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert!(!retire_old_dropin(&root).unwrap());
        let old = root.join(OLD_DROPIN).unwrap();
        std::fs::create_dir_all(old.parent().unwrap()).unwrap();
        std::fs::write(&old, "[Service]\nExecStart=\n").unwrap();
        assert!(retire_old_dropin(&root).unwrap());
        assert!(!old.exists());
        assert!(!retire_old_dropin(&root).unwrap());
    }
}
