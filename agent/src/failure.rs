//! How a run ends badly: the [`Kind`] of failure (the exit code), the phase
//! it ended in, and the error. Each error type knows its kind
//! ([`ExitKind`]), so call sites only name the phase and, where it helps
//! the reader of the log, what was being done.

use autonode_agent::config::LoadError;
use autonode_agent::csr::CsrError;
use autonode_agent::ignition::IgnitionError;
use autonode_agent::imds::{EndpointError, ImdsError};
use autonode_agent::join::KeepError;
use autonode_agent::keys::KeyError;
use autonode_agent::kubelet::KubeletError;
use autonode_agent::server_client::JoinError;
use autonode_agent::state::StateError;
use autonode_shared::protocol::Phase;

/// What kind of failure ended the run; the exit code (see `cli`'s table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Failed = 1,
    Refused = 2,
    Deadline = 3,
    Config = 4,
}

/// A failed run.
#[derive(Debug)]
pub struct Failure {
    pub kind: Kind,
    pub phase: Phase,
    pub error: anyhow::Error,
}

/// The kind of failure an error is.
pub trait ExitKind {
    fn exit_kind(&self) -> Kind;
}

/// Turns a `Result` into a [`Failure`] in a phase.
pub trait OrFail<T> {
    /// The error's own kind.
    fn or_fail(self, phase: Phase) -> Result<T, Failure>;
    /// The error's own kind, with what was being done.
    fn or_fail_in(self, phase: Phase, context: &'static str) -> Result<T, Failure>;
}

impl<T, E> OrFail<T> for Result<T, E>
where
    E: ExitKind + std::error::Error + Send + Sync + 'static,
{
    fn or_fail(self, phase: Phase) -> Result<T, Failure> {
        self.map_err(|e| Failure {
            kind: e.exit_kind(),
            phase,
            error: anyhow::Error::new(e),
        })
    }

    fn or_fail_in(self, phase: Phase, context: &'static str) -> Result<T, Failure> {
        self.map_err(|e| Failure {
            kind: e.exit_kind(),
            phase,
            error: anyhow::Error::new(e).context(context),
        })
    }
}

/// For an error whose kind depends on what it was about (a path under the
/// root is the operator's when it came from a flag, the node's otherwise).
pub fn fail_as<E>(kind: Kind, phase: Phase, context: &'static str) -> impl FnOnce(E) -> Failure
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| Failure {
        kind,
        phase,
        error: anyhow::Error::new(e).context(context),
    }
}

/// IMDS that never answered is the deadline; one that answered wrongly is
/// a failure of this instance.
impl ExitKind for ImdsError {
    fn exit_kind(&self) -> Kind {
        use ImdsError::*;
        match self {
            GaveUp { .. } => Kind::Deadline,
            // The operator's to fix, and no retry fixes it.
            TurnedOff { .. } | BadMode { .. } | BadEndpoint(_) => Kind::Config,
            Refused { .. } | Missing(_) | Invalid { .. } => Kind::Failed,
        }
    }
}

impl ExitKind for EndpointError {
    fn exit_kind(&self) -> Kind {
        Kind::Config
    }
}

/// Everything in loading the config is the operator's to fix, except IMDS
/// not answering with userData.
impl ExitKind for LoadError {
    fn exit_kind(&self) -> Kind {
        match self {
            LoadError::UserData(e) => e.exit_kind(),
            _ => Kind::Config,
        }
    }
}

impl ExitKind for JoinError {
    fn exit_kind(&self) -> Kind {
        match self {
            JoinError::Refused { .. } | JoinError::BadResponse(_) => Kind::Refused,
            JoinError::GaveUp { .. } => Kind::Deadline,
            JoinError::Trust(_) => Kind::Config,
            JoinError::Transient(_) => Kind::Failed,
        }
    }
}

/// A config the server sent that the agent will not apply is a refusal;
/// a filesystem or tool failure is this node's.
impl ExitKind for IgnitionError {
    fn exit_kind(&self) -> Kind {
        if self.is_refusal() {
            Kind::Refused
        } else {
            Kind::Failed
        }
    }
}

/// An answer that does not fit this node is the server's refusal; failing
/// to save one is this node's failure.
impl ExitKind for KeepError {
    fn exit_kind(&self) -> Kind {
        match self {
            KeepError::Unfit(_) => Kind::Refused,
            KeepError::Save(_) => Kind::Failed,
        }
    }
}

impl ExitKind for KubeletError {
    fn exit_kind(&self) -> Kind {
        match self {
            KubeletError::Refused(_) => Kind::Refused,
            _ => Kind::Failed,
        }
    }
}

/// This node's own failures.
macro_rules! failed {
    ($($error:ty),*) => {$(
        impl ExitKind for $error {
            fn exit_kind(&self) -> Kind {
                Kind::Failed
            }
        }
    )*};
}
failed!(KeyError, StateError, CsrError, std::io::Error);
