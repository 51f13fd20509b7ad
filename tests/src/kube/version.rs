//! Which Kubernetes the harness runs, read from the binaries themselves.
//!
//! The versions the suite can run are those pinned under `tests/kube/`
//! (`tests/kube/pin`, built by `tests/setup/build-kube`): by default the
//! newest, or the one `AUTONODE_KUBE_VERSION` names (`tests/run --kube`),
//! or whatever binaries `AUTONODE_KUBE_BIN` points at. Flags and behaviour
//! that differ between versions are chosen from a [`KubeVersion`], parsed
//! from a binary's `--version` output.

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

/// Where the pinned versions' Go modules are (`tests/kube/v1.<minor>/`).
fn pins_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/kube"))
}

/// The versions pinned under `tests/kube/`, newest first: the
/// `k8s.io/kubernetes` each module's go.mod requires. The same list
/// `tests/setup/build-kube --list` prints, so the two agree on the default.
pub fn pinned() -> Result<Vec<KubeVersion>> {
    let dir = pins_dir();
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let go_mod = entry?.path().join("go.mod");
        let Ok(text) = std::fs::read_to_string(&go_mod) else {
            continue; // the pin script, not a module
        };
        let version = text
            .lines()
            .find_map(|line| line.strip_prefix("require k8s.io/kubernetes "))
            .and_then(|word| KubeVersion::parse_word(word.trim()))
            .with_context(|| format!("{}: no k8s.io/kubernetes version", go_mod.display()))?;
        versions.push(version);
    }
    versions.sort_unstable_by(|a, b| b.cmp(a));
    if versions.is_empty() {
        bail!("no Kubernetes versions pinned under {}", dir.display());
    }
    Ok(versions)
}

/// The version under test: `AUTONODE_KUBE_VERSION` (`1.31` or `1.31.4`,
/// one of the pinned), else the newest pinned.
pub fn under_test() -> Result<KubeVersion> {
    pin_under_test("AUTONODE_KUBE_VERSION", &pinned()?, numbers)
}

/// The pinned version `wanted` (`1.31`, `1.31.4`, `v1.31.4`) names.
#[cfg(test)]
fn choose(pinned: &[KubeVersion], wanted: &str) -> Result<KubeVersion> {
    choose_pin("AUTONODE_KUBE_VERSION", pinned, wanted, numbers)
}

fn numbers(v: &KubeVersion) -> (u32, u32, u32) {
    (v.major, v.minor, v.patch)
}

/// The pin the environment's `variable` names, else the newest (the
/// first of `pinned`, newest first): how the suite picks the Kubernetes
/// and the Karpenter under test. `numbers` reads a pin's major, minor and
/// patch.
pub fn pin_under_test<V: Copy + fmt::Display>(
    variable: &str,
    pinned: &[V],
    numbers: fn(&V) -> (u32, u32, u32),
) -> Result<V> {
    match std::env::var(variable) {
        Ok(wanted) if !wanted.trim().is_empty() => {
            choose_pin(variable, pinned, wanted.trim(), numbers)
        }
        _ => pinned
            .first()
            .copied()
            .with_context(|| format!("nothing is pinned for {variable}")),
    }
}

/// The pin among `pinned` that `wanted` (`1.31`, `1.31.4`, `v1.31.4`)
/// names; the error names `variable` and the pins.
pub fn choose_pin<V: Copy + fmt::Display>(
    variable: &str,
    pinned: &[V],
    wanted: &str,
    numbers: fn(&V) -> (u32, u32, u32),
) -> Result<V> {
    let bare = wanted.strip_prefix('v').unwrap_or(wanted);
    pinned
        .iter()
        .copied()
        .find(|v| {
            let (major, minor, patch) = numbers(v);
            bare == format!("{major}.{minor}.{patch}") || bare == format!("{major}.{minor}")
        })
        .with_context(|| {
            let list: Vec<String> = pinned.iter().map(ToString::to_string).collect();
            format!(
                "{variable}={wanted} is not pinned; pinned: {}",
                list.join(", ")
            )
        })
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
    fn the_pins_name_versions_and_a_version_is_chosen_by_minor_or_patch() {
        let pinned = pinned().unwrap();
        assert!(pinned.windows(2).all(|w| w[0] > w[1]), "{pinned:?}");
        let newest = pinned[0];
        let minor = format!("{}.{}", newest.major, newest.minor);
        assert_eq!(choose(&pinned, &minor).unwrap(), newest);
        assert_eq!(choose(&pinned, &newest.to_string()).unwrap(), newest);
        let err = choose(&pinned, "1.19").unwrap_err().to_string();
        assert!(err.contains(&newest.to_string()), "{err}");
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
