//! What every other part of the harness stands on: child processes that
//! die with their test, the one polling loop, throwaway CAs, where the
//! setup scripts keep their builds, and the figures tests write.

pub mod bench;
pub mod cache;
pub mod pki;
pub mod poll;
pub mod process;
