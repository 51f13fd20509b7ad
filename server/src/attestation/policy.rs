//! The operator's attestation policy: which EC2NodeClasses must attest
//! and which boots (PCR values) each admits. It is a file the operator
//! mounts (`--attestation-policy`, the chart's `attestation.policy`), never
//! anything on the class: whoever may edit an EC2NodeClass must not be able
//! to turn attestation off or widen what boots it admits.
//!
//! ```yaml
//! classes:
//!   secure-nodes:                 # an EC2NodeClass name
//!     require: nitrotpm           # the only mode
//!     measurements: [autonode-al2023-0.3.0-x86_64]   # any one matching admits
//! measurements:
//!   autonode-al2023-0.3.0-x86_64: # the bake's measurements.yaml entry
//!     pcrs:                       # index -> SHA-384 (96 hex); each must equal the document's
//!       4: "…"
//!       7: "…"
//!       12: "…"
//! ```
//!
//! The file is read at start (a bad one stops the server) and again when
//! it changes ([`PolicyFile::reload`]); a bad change is said once and the
//! last good policy kept.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The largest policy file read: a fleet's classes and images fit many
/// times over.
const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// PCR indices a NitroTPM document carries (its SHA-384 bank).
const PCRS: u8 = 24;

/// Why a policy file is refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("reading attestation policy {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("attestation policy {path} is {len} bytes, more than {MAX_FILE_BYTES}")]
    TooLarge { path: PathBuf, len: u64 },
    #[error("attestation policy {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// What a class requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Require {
    /// A NitroTPM attestation document on every join.
    Nitrotpm,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileClass {
    require: Require,
    measurements: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMeasurement {
    pcrs: BTreeMap<u8, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePolicy {
    #[serde(default)]
    classes: BTreeMap<String, FileClass>,
    #[serde(default)]
    measurements: BTreeMap<String, FileMeasurement>,
}

/// One boot a class admits: the PCRs it pins, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measurement {
    pub name: String,
    pub pcrs: BTreeMap<u8, [u8; 48]>,
}

impl Measurement {
    /// Whether every PCR this measurement pins has its value in `pcrs`.
    pub fn admits(&self, pcrs: &BTreeMap<u8, [u8; 48]>) -> bool {
        self.pcrs.iter().all(|(i, want)| pcrs.get(i) == Some(want))
    }
}

/// A class that must attest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassPolicy {
    pub require: Require,
    /// The boots it admits: any one matching.
    pub measurements: Vec<Measurement>,
}

/// The policy: classes not named here need no attestation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    classes: BTreeMap<String, ClassPolicy>,
}

impl Policy {
    /// What class `name` requires, if it must attest.
    pub fn class(&self, name: &str) -> Option<&ClassPolicy> {
        self.classes.get(name)
    }

    /// How many classes must attest.
    pub fn classes(&self) -> usize {
        self.classes.len()
    }

    /// The policy in `text` (YAML, see the module docs); errors name the
    /// class, measurement or PCR at fault.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: FilePolicy = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        let mut measurements = BTreeMap::new();
        for (name, m) in file.measurements {
            measurements.insert(name.clone(), measurement(name, m)?);
        }
        let mut classes = BTreeMap::new();
        for (class, c) in file.classes {
            if c.measurements.is_empty() {
                return Err(format!(
                    "class {class:?} lists no measurements: it would admit no machine"
                ));
            }
            let named = c.measurements.iter().map(|m| {
                measurements.get(m).cloned().ok_or_else(|| {
                    format!("class {class:?} names measurement {m:?}, which `measurements` lacks")
                })
            });
            let measurements = named.collect::<Result<_, _>>()?;
            let require = c.require;
            classes.insert(
                class,
                ClassPolicy {
                    require,
                    measurements,
                },
            );
        }
        Ok(Self { classes })
    }
}

fn measurement(name: String, m: FileMeasurement) -> Result<Measurement, String> {
    if m.pcrs.is_empty() {
        return Err(format!(
            "measurement {name:?} pins no PCR: it would admit any boot"
        ));
    }
    let mut pcrs = BTreeMap::new();
    for (index, value) in m.pcrs {
        if index >= PCRS {
            return Err(format!(
                "measurement {name:?}: PCR {index} is not 0..{}",
                PCRS - 1
            ));
        }
        let bytes = parse_hex(&value).filter(|b| b.len() == 48).ok_or_else(|| {
            format!("measurement {name:?}: PCR {index} is not 96 hex digits (SHA-384)")
        })?;
        let mut pcr = [0; 48];
        pcr.copy_from_slice(&bytes);
        pcrs.insert(index, pcr);
    }
    Ok(Measurement { name, pcrs })
}

fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// The policy's file and its last good reading.
pub struct PolicyFile {
    path: PathBuf,
    /// The bytes last read, good or bad: a change is what is read again.
    last: Vec<u8>,
}

impl PolicyFile {
    /// Reads `path`; a bad file is an error (the server does not start).
    pub fn load(path: &Path) -> Result<(Self, Policy), PolicyError> {
        let bytes = read(path)?;
        let policy = parse_bytes(path, &bytes)?;
        let file = Self {
            path: path.to_path_buf(),
            last: bytes,
        };
        Ok((file, policy))
    }

    /// The file's policy if it changed since last read: `Ok(None)` when
    /// unchanged, an error when changed into something unreadable (not
    /// said again until it changes once more).
    pub fn reload(&mut self) -> Result<Option<Policy>, PolicyError> {
        let bytes = read(&self.path)?;
        if bytes == self.last {
            return Ok(None);
        }
        self.last = bytes;
        parse_bytes(&self.path, &self.last).map(Some)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, PolicyError> {
    let failed = |source| PolicyError::Read {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(failed)?.len();
    if len > MAX_FILE_BYTES {
        return Err(PolicyError::TooLarge {
            path: path.to_path_buf(),
            len,
        });
    }
    std::fs::read(path).map_err(failed)
}

fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<Policy, PolicyError> {
    let invalid = |message| PolicyError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| invalid(e.to_string()))?;
    Policy::parse(text).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn policy(pcr: &str) -> String {
        format!(
            "classes:\n  secure:\n    require: nitrotpm\n    measurements: [img]\n\
             measurements:\n  img:\n    pcrs:\n      4: \"{pcr}\"\n      7: \"{A}\"\n"
        )
    }

    #[test]
    fn a_class_admits_a_boot_whose_pinned_pcrs_all_match() {
        let policy = Policy::parse(&policy(A)).unwrap();
        assert!(policy.class("other").is_none());
        let class = policy.class("secure").unwrap();
        let mut pcrs: BTreeMap<u8, [u8; 48]> = (0..24).map(|i| (i, [0xaa; 48])).collect();
        assert!(class.measurements[0].admits(&pcrs));
        pcrs.insert(7, [0xab; 48]);
        assert!(!class.measurements[0].admits(&pcrs));
        pcrs.remove(&4);
        assert!(!class.measurements[0].admits(&pcrs));
    }

    #[test]
    fn a_policy_that_would_admit_everything_or_nothing_is_refused() {
        let cases = [
            (policy("abc"), "PCR 4 is not 96 hex digits"),
            (policy(A).replace("7:", "24:"), "PCR 24 is not 0..23"),
            (policy(A).replace("[img]", "[]"), "lists no measurements"),
            (
                policy(A).replace("[img]", "[gone]"),
                "names measurement \"gone\"",
            ),
            (
                "measurements:\n  img:\n    pcrs: {}\n".into(),
                "pins no PCR",
            ),
            (policy(A).replace("nitrotpm", "none"), "unknown variant"),
            (policy(A).replace("require:", "requires:"), "unknown field"),
        ];
        for (text, words) in cases {
            let error = Policy::parse(&text).unwrap_err();
            assert!(error.contains(words), "{words:?} not in {error:?}");
        }
        assert_eq!(Policy::parse("{}").unwrap().classes(), 0);
    }

    #[test]
    fn a_file_is_read_again_only_when_it_changes_and_a_bad_change_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, policy(A)).unwrap();
        let (mut file, first) = PolicyFile::load(&path).unwrap();
        assert_eq!(first.classes(), 1);
        assert!(file.reload().unwrap().is_none());
        std::fs::write(&path, "classes: [").unwrap();
        assert!(matches!(file.reload(), Err(PolicyError::Invalid { .. })));
        assert!(
            file.reload().unwrap().is_none(),
            "said once, until it changes"
        );
        std::fs::write(&path, "{}").unwrap();
        assert_eq!(file.reload().unwrap().unwrap().classes(), 0);
        std::fs::write(&path, "x".repeat(MAX_FILE_BYTES as usize + 1)).unwrap();
        assert!(matches!(file.reload(), Err(PolicyError::TooLarge { .. })));
        assert!(PolicyFile::load(&dir.path().join("none")).is_err());
    }
}
