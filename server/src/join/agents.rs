//! What this server knows of agent versions: which released agents there
//! are (the `version` label of `autonode_join_agent_versions_total`, so an
//! operator sees when an old AMI is gone) and from which release on the
//! serving CSR names only the instance's primary addresses (see
//! [`Refusal::AgentTooOld`](super::refusal::Refusal::AgentTooOld)).
//!
//! An agent's version is request data: it becomes a metric label only as
//! one of the fixed words below, so no client can grow the metric, and it
//! decides a verdict in one place only: an operator's
//! `--min-agent-version` ([`MinVersion`]), judged after the NodeClaim's
//! binding (so only the bound machine's own keys, or an unbound claim's
//! first join, can meet it), where claiming an older version than the
//! agent's own gains a caller nothing it could not have by binding the
//! claim itself.

/// Every agent version released up to this server, oldest first. Agents
/// built from any revision before the first release report `0.1.0`.
/// A release adds its own version here (docs/upgrading.md).
pub const RELEASED: &[&str] = &["0.1.0", "0.2.0"];

/// The first agent release whose serving CSR names only the instance's
/// primary addresses.
pub const PRIMARY_ADDRESSES_ONLY: &str = "0.2.0";

/// The metric label for an agent's reported version: the version itself
/// when it is a released one, else `newer` or `older` than every release
/// this server knows (an agent built from a later commit, or a pre-release
/// build), else `unknown` (not `MAJOR.MINOR.PATCH`).
pub fn label(reported: &str) -> &'static str {
    if let Some(known) = RELEASED.iter().find(|v| **v == reported) {
        return known;
    }
    let (Some(version), Some(newest), Some(oldest)) = (
        parse(reported),
        RELEASED.last().and_then(|v| parse(v)),
        RELEASED.first().and_then(|v| parse(v)),
    ) else {
        return "unknown";
    };
    if version > newest {
        "newer"
    } else if version < oldest {
        "older"
    } else {
        // Between two releases (a build of a commit between them), or a
        // pre-release suffix of one.
        "unknown"
    }
}

/// The oldest agent release a server admits (`--min-agent-version`): the
/// operator's way to retire AMIs whose agent left the supported window
/// (docs/upgrading.md). A release `MAJOR.MINOR.PATCH`, never a pre-release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinVersion((u64, u64, u64));

/// A `--min-agent-version` that is not a release version.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a release version MAJOR.MINOR.PATCH (e.g. 0.3.0)")]
pub struct NotARelease(String);

impl std::str::FromStr for MinVersion {
    type Err = NotARelease;

    fn from_str(text: &str) -> Result<Self, NotARelease> {
        let plain = text.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        match parse(text) {
            Some(triple) if plain => Ok(Self(triple)),
            _ => Err(NotARelease(text.to_string())),
        }
    }
}

impl std::fmt::Display for MinVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor, patch) = self.0;
        write!(f, "{major}.{minor}.{patch}")
    }
}

impl MinVersion {
    /// Whether an agent reporting `reported` is this release or later. A
    /// pre-release (`0.3.0-dev`, a build of the branch before 0.3.0 was
    /// cut) comes before its release, as semantic versioning orders them;
    /// a build suffix (`+…`) is ignored; a version that does not parse is
    /// not known to be recent enough, so it does not meet any minimum.
    pub fn admits(&self, reported: &str) -> bool {
        let Some(version) = parse(reported) else {
            return false;
        };
        let pre_release = reported.split('+').next().is_some_and(|v| v.contains('-'));
        version > self.0 || (version == self.0 && !pre_release)
    }
}

/// `MAJOR.MINOR.PATCH`, with any `-pre` or `+build` suffix ignored.
fn parse(version: &str) -> Option<(u64, u64, u64)> {
    let core = version.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let triple = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(triple)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_versions_are_their_own_label_and_anything_else_one_of_three_words() {
        assert_eq!(label("0.1.0"), "0.1.0");
        assert_eq!(label("0.2.0"), "0.2.0");
        assert_eq!(label("0.3.0"), "newer");
        assert_eq!(label("1.0.0+abc"), "newer");
        assert_eq!(label("0.0.9"), "older");
        assert_eq!(label("0.1.5"), "unknown");
        for junk in ["", "test", "0.2", "0.2.0.1", "x.y.z", "\n0.1.0"] {
            assert_eq!(label(junk), "unknown", "{junk:?}");
        }
    }

    #[test]
    fn this_agent_release_is_one_the_server_knows() {
        // The agent and server are released together: a release that
        // forgot to add itself here would meter its own agents as `newer`.
        // Between releases the workspace is the next one's pre-release
        // (`0.3.0-dev`), newer than every release listed.
        let own = env!("CARGO_PKG_VERSION");
        let expected = if own.contains('-') { "newer" } else { own };
        assert_eq!(label(own), expected);
        assert!(RELEASED.contains(&PRIMARY_ADDRESSES_ONLY));
    }

    #[test]
    fn a_minimum_admits_its_release_and_later_and_nothing_it_cannot_order() {
        let min: MinVersion = "0.3.0".parse().unwrap();
        assert_eq!(min.to_string(), "0.3.0");
        for admitted in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "0.3.0+abc", "0.4.0-dev"] {
            assert!(min.admits(admitted), "{admitted}");
        }
        for refused in [
            "0.2.0",
            "0.1.0",
            "0.3.0-dev",
            "0.3.0-rc.1+x",
            "",
            "junk",
            "0.3",
        ] {
            assert!(!min.admits(refused), "{refused:?}");
        }
        for bad in ["0.3", "0.3.0-dev", "v0.3.0", "0.3.0+x", " 0.3.0", ""] {
            assert!(bad.parse::<MinVersion>().is_err(), "{bad:?}");
        }
    }
}
