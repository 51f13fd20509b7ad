//! The subset of Ignition spec v3 the agent applies.
//!
//! Defined in [`autonode_shared::ignition`] (types, parsing, validation), so
//! the server refuses an operator's config at render time by exactly the
//! rules the agent applies here; re-exported under its old path.

pub use autonode_shared::ignition::*;
