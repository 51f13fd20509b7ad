//! autonode's shared library.
//!
//! Everything here is pure: bytes in, typed values or typed errors out. No
//! I/O, no clocks (a clock is passed in where time matters), no global state.
//! Both halves depend on it, so the contract between them lives here:
//!
//! - [`protocol`]: the JSON messages the agent and server exchange.
//! - [`identity`]: verifying AWS-signed instance identity documents
//!   (pinned certificates only) and the policy on who may join when.

#![forbid(unsafe_code)]

pub mod identity;
pub mod protocol;
