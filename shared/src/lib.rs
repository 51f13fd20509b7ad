//! autonode's shared library.
//!
//! Everything here is pure: bytes in, typed values or typed errors out. No
//! I/O, no clocks (a clock is passed in where time matters), no global state.
//! Both halves depend on it, so the contract between them lives here:
//!
//! - [`protocol`]: the JSON messages the agent and server exchange.

#![forbid(unsafe_code)]

pub mod protocol;
