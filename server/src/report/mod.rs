//! One agent report, start to end: progress reports from agents, turned
//! into Events, metrics and, for a definite failure, the NodeClaim's
//! deletion. The front ([`crate::front::api`]) reads the request and
//! answers it; this folder decides what a report may do.
//!
//! Deleting the NodeClaim of a machine whose agent gave up makes Karpenter
//! replace it now instead of after its 15-minute registration timeout. Only
//! a report the server can trust may do that. The identity document alone
//! is not enough: any process on the instance can read it, forever. So:
//!
//! - Before the instance is bound to a client key (its first join), a
//!   report cannot be checked against anything: it is shown as an Event
//!   and logged, and a fatal one changes nothing (`Trust::Unverified`).
//! - Once bound, a report must be signed with the bound key, carry a
//!   timestamp at most [`REPORT_WINDOW`] behind the server's clock and
//!   [`FUTURE_SKEW`] ahead, fit its instance's quota ([`QUOTA_BURST`], then
//!   one per [`QUOTA_PERIOD`]), and not be one this replica has already
//!   accepted ([`Replays`]). Only such a report may delete the NodeClaim
//!   (or, with deletion off, mark it failed).
//!
//! The quota and the replay memory are per instance, and counted only for
//! reports signed with the instance's bound key: one node flooding signed
//! reports is told 429 and fills only its own slots, never another
//! machine's, so every other node's fatal report still acts.
//!
//! A report's steps, in order, each a file of this folder:
//!
//! 1. **authenticate** (`authenticate`): the identity document verified
//!    and its account and region allowed (the join's own checks, not its
//!    `pendingTime` window: a failure may be reported later), the
//!    instance's one NodeClaim, its binding, and for a bound instance the
//!    signature, the window, the quota and the replay memory
//!    ([`replays`]). The result says how far the report is believed.
//! 2. **act** (`act`): the report counted, logged and shown as an Event on
//!    the NodeClaim; a signed fatal one deletes the NodeClaim (or marks it
//!    failed).
//!
//! Either step may stop the report with a [`ReportError`] ([`refusal`]):
//! a refusal (final) or unavailable (retried). A refusal at authenticate is
//! counted and logged there, within each reason's budget of warn lines.

mod act;
mod authenticate;
pub mod refusal;
pub mod replays;

pub use authenticate::{unbound_read_limiter, UNBOUND_READ_BURST, UNBOUND_READ_PERIOD};
pub use refusal::{ReportError, ReportRefusal};
pub use replays::{Replays, QUOTA_BURST, QUOTA_PERIOD, REPLAY_CAPACITY, REPLAY_SLOTS_PER_INSTANCE};

use crate::kube::events::Events;
use crate::kube::metrics::Metrics;
use crate::kube::nodeclaim::NodeClaims;
use crate::primitives::clock::Clock;
use crate::primitives::limiter::Limiter;
use act::act;
use authenticate::authenticate;
use autonode_shared::identity::{Policy, TrustStore};
use autonode_shared::protocol::ReportRequest;

/// How far a signed report's `timestamp` may be behind the server's clock,
/// in seconds (ahead: [`FUTURE_SKEW`]).
///
/// The window is what lets the server forget: a report older than this is
/// refused on its timestamp, so [`Replays`] need only remember the reports
/// it accepted within the last two windows. Five minutes (Kerberos's
/// default skew too) is wide enough for an agent whose clock has not synced
/// yet on a freshly booted machine plus a report's own retries (10 s), and
/// narrow enough that a captured report is useless soon after and the set
/// stays small.
pub const REPORT_WINDOW: i64 = 300;

/// How far a signed report's `timestamp` may be ahead of the server's
/// clock, in seconds.
///
/// A report is remembered until its timestamp plus [`REPORT_WINDOW`], so a
/// timestamp in the future is memory held longer: with the full window
/// ahead, one report held a slot for ten minutes. A clock runs ahead of the
/// server's only by drift, which on EC2 (the hypervisor's clock at boot,
/// Amazon Time Sync after) is well under a second; a minute covers that and
/// a server whose own clock lags, and keeps a report's memory under
/// [`REPORT_WINDOW`] + a minute. Behind stays wide: a report may be retried,
/// or written before the network (and so the time sync) came up.
pub const FUTURE_SKEW: i64 = 60;

/// What report handling needs.
pub struct ReportContext {
    pub trust: TrustStore,
    pub policy: Policy,
    pub claims: NodeClaims,
    pub events: Events,
    pub metrics: Metrics,
    /// Injected so tests can set the time.
    pub clock: Clock,
    /// Signed reports this replica accepted within the window.
    pub replays: Replays,
    /// API reads of unbound NodeClaims, per instance (see
    /// [`unbound_read_limiter`]).
    pub unbound_reads: Limiter,
    /// Warn lines about refused reports, per reason (see
    /// [`refusal_line_limiter`](crate::primitives::limiter::refusal_line_limiter)).
    pub refusal_lines: Limiter,
}

/// Handles one report: authenticate, then act. A signed report is
/// remembered as accepted only when its handling completes.
pub async fn handle(
    ctx: &ReportContext,
    request_id: &str,
    report: ReportRequest,
) -> Result<(), ReportError> {
    let sender = authenticate(ctx, &report)
        .await
        .inspect_err(|e| refusal::refused(ctx, request_id, e))?;
    let admitted = ctx.replays.hold(sender.trust.digest());
    act(ctx, request_id, &sender, &report).await?;
    admitted.keep();
    Ok(())
}
