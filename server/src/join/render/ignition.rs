//! The node's Ignition config: the operator's layers, each checked by the
//! agent's own rules, merged under the layer autonode generates.

use super::kubelet::KUBELET_CONFIG_PATH;
use super::IgnitionError;
use autonode_shared::ignition::{self as spec, Config};
use base64::Engine as _;
use serde_json::Value;
use std::borrow::Borrow;
use std::collections::BTreeMap;

/// The spec version of the generated layer (and of a config without
/// operator layers). The merged config takes the newest layer's version,
/// so operator layers up to [`spec::MAX_MINOR`] keep theirs.
const GENERATED_MINOR: u32 = 4;
const _: () = assert!(GENERATED_MINOR <= spec::MAX_MINOR);

/// Parses an operator's Ignition config (JSON text) and checks it by the
/// agent's rules ([`spec::parse`], the one check the agent also runs before
/// applying: shape, versions, data URLs decoded and hashes verified, paths,
/// names, duplicates within the config). `origin` names it in errors (e.g.
/// `ConfigMap autonode-system/base`). `autonode-server ignition check` runs
/// exactly this.
pub fn parse_layer(origin: &str, text: &str) -> Result<Config, IgnitionError> {
    let value: Value = serde_json::from_str(text).map_err(|e| IgnitionError::Json {
        origin: origin.to_string(),
        error: e.to_string(),
    })?;
    spec::parse(&value).map_err(|error| IgnitionError::Spec {
        origin: origin.to_string(),
        error,
    })
}

/// The node's Ignition config: `layers` (operator configs, lowest
/// precedence first, already checked by [`parse_layer`]) merged under the
/// generated layer, which writes `kubelet_config` where the agent does.
///
/// The result is checked again by [`spec::parse`], exactly as the agent will
/// check it, so a config that would be refused on the node is never served.
pub fn ignition<L: Borrow<Config>>(
    layers: &[L],
    kubelet_config: &Value,
) -> Result<Value, IgnitionError> {
    let generated = generated_layer(kubelet_config)?;
    let operators = layers.iter().map(Borrow::borrow);
    let merged = merge(operators.chain(std::iter::once(&generated)));
    let value = serde_json::to_value(&merged)?;
    spec::parse(&value).map_err(IgnitionError::Merged)?;
    Ok(value)
}

/// What autonode itself puts in every node's config.
fn generated_layer(kubelet_config: &Value) -> Result<Config, IgnitionError> {
    // The same bytes the agent writes, so applying both changes the file once.
    let bytes = serde_json::to_vec_pretty(kubelet_config)?;
    let source = format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    );
    let file = spec::File {
        path: KUBELET_CONFIG_PATH.to_string(),
        overwrite: Some(true),
        mode: Some(0o644),
        user: spec::OwnerId::default(),
        group: spec::OwnerId::default(),
        contents: spec::Contents {
            source: Some(source),
            ..Default::default()
        },
    };
    let mut config = Config::default();
    config.ignition.version = version(GENERATED_MINOR);
    config.storage.files.push(file);
    Ok(config)
}

/// One entry of the storage namespace.
enum Entry {
    File(spec::File),
    Directory(spec::Directory),
    Link(spec::Link),
}

/// Later layers replace earlier entries at the same path, unit name, user
/// name or group name; the output is sorted by path and name, whatever
/// order the inputs had. Paths need no cleaning: [`spec::parse`] refuses
/// any that is not fully simplified, so equal places are equal strings.
fn merge<'a>(layers: impl Iterator<Item = &'a Config>) -> Config {
    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    let mut units = BTreeMap::new();
    let mut users = BTreeMap::new();
    let mut groups = BTreeMap::new();
    let mut minor = 0;
    for layer in layers {
        // The newest layer's version, so every field any layer uses is
        // known at the merged version (fields are only ever added).
        minor = minor.max(layer.ignition.minor().unwrap_or(0));
        let storage = &layer.storage;
        for file in &storage.files {
            entries.insert(file.path.clone(), Entry::File(file.clone()));
        }
        for directory in &storage.directories {
            entries.insert(directory.path.clone(), Entry::Directory(directory.clone()));
        }
        for link in &storage.links {
            entries.insert(link.path.clone(), Entry::Link(link.clone()));
        }
        for unit in &layer.systemd.units {
            units.insert(unit.name.clone(), unit.clone());
        }
        for user in &layer.passwd.users {
            users.insert(user.name.clone(), user.clone());
        }
        for group in &layer.passwd.groups {
            groups.insert(group.name.clone(), group.clone());
        }
    }
    let mut out = Config::default();
    out.ignition.version = version(minor);
    out.passwd.users = users.into_values().collect();
    out.passwd.groups = groups.into_values().collect();
    for entry in entries.into_values() {
        match entry {
            Entry::File(file) => out.storage.files.push(file),
            Entry::Directory(directory) => out.storage.directories.push(directory),
            Entry::Link(link) => out.storage.links.push(link),
        }
    }
    out.systemd.units = units.into_values().collect();
    out
}

fn version(minor: u32) -> String {
    format!("3.{minor}.0")
}
