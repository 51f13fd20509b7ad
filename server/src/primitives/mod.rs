//! The server's primitives: one of each small concept the rest is built
//! on, none of them Kubernetes plumbing, so that every role folder uses the
//! same one instead of writing its own.
//!
//! - [`bounded`]: the one bounded map (a size limit, the least recently
//!   used forgotten first).
//! - [`limiter`]: the one per-key token bucket.
//! - [`told`]: the one "tell once" (a note told when it starts or changes,
//!   or again after a while).
//! - [`clock`]: the server's side of the one wall clock.
//! - [`backoff`]: how the server's watches come back.
//! - [`quantity`]: resource quantities read into one exact number.
//!
//! Nothing here imports the role folders (`kube/`, `join/`, `report/`,
//! `ec2/`, `controllers/`): they import these.

pub mod backoff;
pub mod bounded;
pub mod clock;
pub mod limiter;
pub mod quantity;
pub mod told;
