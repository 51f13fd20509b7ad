//! The budget of refused documents per source address: a source whose
//! joins and reports are refused (403) faster than
//! `--refusals-per-source` a second waits, before its next TLS handshake,
//! until its budget has a token again.
//!
//! A refusal is the join API's dearest answer to a caller that can never
//! succeed: a TLS handshake, the document's RSA signature, the policy, and
//! for a report its signature too. An honest agent is refused once and
//! stops (a 403 is final to every agent), so a source refused many times a
//! second is a caller sending documents in a loop, and it was answered as
//! fast as the server's one worker thread could refuse: 16 callers from one
//! address were refused 1,000 times a second and made a burst of honest
//! joins 1.3 to 1.6 times slower (docs/benchmarks.md, "Issue 51, sixth
//! step").
//!
//! A wait, not a refusal: connections from a source in debt wait (each one
//! holding only its connection's place, which a newcomer over a cap may
//! take), and go on together when a token is there. Each refusal past the
//! budget is a period's wait for the source, so over any time `t` a source
//! is refused at most a burst, `t` times the rate, and what it had past
//! this gate when its budget ran out (its connections: at most
//! `--max-connections-per-source`). An honest machine behind the same NAT
//! address as such a caller waits at most that debt (a second for 16
//! looping callers at the defaults), never shut out; a wait past the
//! handshake's own deadline is closed at once, and the agent comes back.
//! The refused connection is closed after its answer, so the next try is a
//! new connection, which waits here.
//!
//! What it does not bound: a caller with many source addresses (IPv6 /64s
//! are cheap). The global caps bound what the server spends on them, and
//! the sources tracked are bounded ([`SOURCES`]): past that, a newly
//! refused source goes uncharged rather than any source tracked being
//! forgotten.

use crate::primitives::limiter::Limiter;
use std::net::IpAddr;
use std::time::Duration;
use tokio::time::Instant;

/// Sources whose refusals are remembered at once: as many as the default
/// connection cap, each a few dozen bytes.
pub const SOURCES: usize = 4096;

/// The budget: refusals a source may have answered, a burst of two seconds'
/// worth then `per_second`; none when `per_second` is 0. Keyed by source
/// address, as the gate counts sources (an IPv6 one by its /64).
pub struct Refusals {
    budget: Option<Limiter<IpAddr>>,
}

impl Refusals {
    pub fn new(per_second: u32) -> Self {
        let budget = (per_second > 0).then(|| {
            let period = Duration::from_secs(1) / per_second;
            Limiter::new(per_second.saturating_mul(2), period, SOURCES)
        });
        Self { budget }
    }

    /// Counts a refusal answered to `source`.
    pub fn charge(&self, source: IpAddr) {
        if let Some(budget) = &self.budget {
            budget.charge(&source, Instant::now().into_std());
        }
    }

    /// Waits until `source` has a refusal left in its budget; [`Overdue`]
    /// at once if that comes after `deadline`.
    pub async fn paid(&self, source: IpAddr, deadline: Instant) -> Result<(), Overdue> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        // Again after each wait: others from the source may have been
        // refused meanwhile. (Tokio's clock, which tests can pause.)
        while let Some(wait) = budget.ready_in(&source, Instant::now().into_std()) {
            let until = Instant::now() + wait;
            if until > deadline {
                return Err(Overdue);
            }
            tokio::time::sleep_until(until).await;
        }
        Ok(())
    }
}

/// A source's budget would have a refusal left only after the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overdue;

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// Past its burst, a source's next handshake waits for the refusals it
    /// ran up; other sources do not; a debt due after the deadline is
    /// turned away at once.
    #[tokio::test(start_paused = true)]
    async fn a_source_refused_past_its_burst_waits_and_others_do_not() {
        let refusals = Refusals::new(4);
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        for _ in 0..8 {
            refusals.charge(a);
        }
        let started = Instant::now();
        refusals.paid(b, far()).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO, "another source");
        refusals.paid(a, far()).await.unwrap();
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(250),
            "a token's worth"
        );
        for _ in 0..16 {
            refusals.charge(a);
        }
        let soon = Instant::now() + Duration::from_secs(1);
        let started = Instant::now();
        assert_eq!(refusals.paid(a, soon).await, Err(Overdue));
        assert_eq!(started.elapsed(), Duration::ZERO, "turned away at once");
    }

    /// 0 turns the budget off.
    #[tokio::test(start_paused = true)]
    async fn zero_turns_the_budget_off() {
        let off = Refusals::new(0);
        for _ in 0..1000 {
            off.charge(ip("10.0.0.1"));
        }
        assert_eq!(off.paid(ip("10.0.0.1"), Instant::now()).await, Ok(()));
    }
}
