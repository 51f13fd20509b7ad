//! Callers of the join API that are not the agent: the protocol spoken
//! directly (honest, or wrong on purpose) and hostile clients.

pub mod hostile;
pub mod joiner;
