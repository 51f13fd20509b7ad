//! What this server knows of agent versions: which released agents there
//! are (the `version` label of `autonode_join_agent_versions_total`, so an
//! operator sees when an old AMI is gone) and from which release on the
//! serving CSR names only the instance's primary addresses (see
//! [`Refusal::AgentTooOld`](super::refusal::Refusal::AgentTooOld)).
//!
//! An agent's version is request data: it never decides a verdict, and it
//! becomes a metric label only as one of the fixed words below, so no
//! client can grow the metric.

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
        assert_eq!(label(env!("CARGO_PKG_VERSION")), env!("CARGO_PKG_VERSION"));
        assert!(RELEASED.contains(&PRIMARY_ADDRESSES_ONLY));
    }
}
