//! Which Kubernetes the harness runs, read from the binaries themselves.
//!
//! The suite runs on v1.20.2 by default (`tests/setup/build-kube`) and on
//! whatever `AUTONODE_KUBE_BIN` points at; flags and behaviour that differ
//! between versions are chosen from a [`KubeVersion`], parsed from a
//! binary's `--version` output.

use anyhow::{bail, Context, Result};
use std::fmt;
use std::path::Path;

/// A Kubernetes release: major, minor, patch. Pre-release and build
/// suffixes (`-eks-abc`, `-rc.1`, `+k3s1`) are ignored: flags and APIs
/// follow the release they are built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KubeVersion {
    /// `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// Whether this is `major.minor` or later (any patch).
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// Parses `--version` output: the first word that looks like a version
    /// (`Kubernetes v1.20.2`, `kube-apiserver v1.34.1`,
    /// `Kubernetes v1.31.0-eks-abc`).
    pub fn parse(output: &str) -> Result<Self> {
        output
            .split_whitespace()
            .find_map(Self::parse_word)
            .with_context(|| format!("no Kubernetes version in {:?}", output.trim()))
    }

    /// One word: `v1.20.2`, `1.20.2`, `v1.31.0-eks-abc`, `v1.30.1+k3s1`.
    fn parse_word(word: &str) -> Option<Self> {
        let word = word.strip_prefix('v').unwrap_or(word);
        let release = word.split(['-', '+']).next()?;
        let mut parts = release.split('.');
        let mut number = || -> Option<u32> {
            let part = parts.next()?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            part.parse().ok()
        };
        let version = Self::new(number()?, number()?, number()?);
        parts.next().is_none().then_some(version)
    }

    /// Runs `binary --version` and parses what it prints.
    pub fn of_binary(binary: &Path) -> Result<Self> {
        let output = std::process::Command::new(binary)
            .arg("--version")
            .output()
            .with_context(|| format!("running {} --version", binary.display()))?;
        if !output.status.success() {
            bail!(
                "{} --version failed ({}): {}",
                binary.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Self::parse(&String::from_utf8_lossy(&output.stdout))
            .with_context(|| format!("{} --version", binary.display()))
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_binaries_print() {
        let cases = [
            ("Kubernetes v1.20.2\n", KubeVersion::new(1, 20, 2)),
            ("kube-apiserver v1.34.1", KubeVersion::new(1, 34, 1)),
            ("Kubernetes v1.31.0-eks-abc", KubeVersion::new(1, 31, 0)),
            ("Kubernetes v1.30.1+k3s1", KubeVersion::new(1, 30, 1)),
            ("Kubernetes v1.29.0-rc.1", KubeVersion::new(1, 29, 0)),
            ("1.25.16", KubeVersion::new(1, 25, 16)),
        ];
        for (text, want) in cases {
            assert_eq!(KubeVersion::parse(text).unwrap(), want, "{text:?}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_version() {
        for text in [
            "",
            "Kubernetes",
            "Kubernetes v1.20",
            "Kubernetes v1.x.2",
            "Kubernetes v1.20.2.3",
            "Kubernetes v-1.20.2",
        ] {
            assert!(KubeVersion::parse(text).is_err(), "{text:?} parsed");
        }
    }

    #[test]
    fn orders_and_compares_by_release() {
        let v = KubeVersion::new(1, 24, 0);
        assert!(v.at_least(1, 24));
        assert!(v.at_least(1, 20));
        assert!(!v.at_least(1, 25));
        assert!(KubeVersion::new(1, 9, 9) < KubeVersion::new(1, 10, 0));
        assert_eq!(KubeVersion::new(1, 31, 0).to_string(), "v1.31.0");
    }
}
