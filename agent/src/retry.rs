//! Retrying as data: a policy (the shared [`Backoff`]) and one overall
//! deadline.
//!
//! Every network step of the agent retries transient failures with capped
//! exponential backoff and jitter, and all of them share one deadline, so
//! the agent gives up (and says why) before Karpenter's registration limit
//! deletes the instance without a word.

use autonode_shared::backoff::Backoff;
use std::collections::hash_map::RandomState;
use std::fmt::Display;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How one kind of request is retried: the shared [`Backoff`] with the
/// agent's values for it. The loop around it is [`retry`]'s: one deadline
/// for the whole run, and a server's Retry-After honoured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy(pub Backoff);

impl RetryPolicy {
    /// The join: the server may be scaling up or waiting on the
    /// kube-controller-manager; be patient but not hammering.
    pub const JOIN: RetryPolicy = RetryPolicy(Backoff {
        initial: Duration::from_secs(1),
        factor: 2,
        cap: Duration::from_secs(30),
        jitter: 0.5,
        attempts: None,
    });
    /// IMDS is local and usually just late at boot: retry quickly.
    pub const IMDS: RetryPolicy = RetryPolicy(Backoff {
        initial: Duration::from_millis(200),
        factor: 2,
        cap: Duration::from_secs(5),
        jitter: 0.25,
        attempts: None,
    });
    /// Reports are best effort: a few quick tries, never blocking the flow.
    pub const REPORT: RetryPolicy = RetryPolicy(Backoff {
        initial: Duration::from_millis(500),
        factor: 2,
        cap: Duration::from_secs(2),
        jitter: 0.5,
        attempts: Some(3),
    });

    /// The delay after `failures` (≥ 1) consecutive failures; `random` in
    /// [0, 1) picks the jittered part.
    pub fn delay(&self, failures: u32, random: f64) -> Duration {
        self.0.delay(failures.saturating_sub(1), random)
    }
}

/// A point in time after which the agent stops trying (tokio's clock, so
/// tests can pause time).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    pub fn after(duration: Duration) -> Self {
        Deadline {
            at: Instant::now() + duration,
        }
    }

    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    pub fn expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// `limit`, shortened so it ends by the deadline.
    pub fn clamp(&self, limit: Duration) -> Duration {
        limit.min(self.remaining())
    }
}

/// What one attempt came to.
#[derive(Debug)]
pub enum Attempt<T, E> {
    Done(T),
    /// Transient: try again, not before `after` if the server said so.
    Retry {
        error: E,
        after: Option<Duration>,
    },
    /// Final: do not try again.
    Fatal(E),
}

/// Why [`retry`] stopped without a result.
#[derive(Debug, thiserror::Error)]
pub enum RetryError<E: Display> {
    #[error("{0}")]
    Fatal(E),
    #[error("gave up after {attempts} attempts; last error: {last}")]
    GaveUp { attempts: u32, last: E },
}

/// A failed attempt that is about to be retried.
#[derive(Debug)]
pub struct Retrying<'a, E> {
    /// Which attempt failed (from 1).
    pub attempt: u32,
    pub error: &'a E,
    /// How long until the next one.
    pub delay: Duration,
}

/// Runs `op` until it is done, fatal, out of attempts, or the next try
/// would start after the deadline. `op` gets the attempt number (from 1)
/// and must bound its own duration with [`Deadline::clamp`].
pub async fn retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    deadline: &Deadline,
    what: &str,
    op: F,
) -> Result<T, RetryError<E>>
where
    E: Display,
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Attempt<T, E>>,
{
    retry_observed(policy, deadline, what, op, |_| {}).await
}

/// [`retry`], telling `observe` of each failure before waiting to retry
/// (the agent reports a join that keeps failing).
pub async fn retry_observed<T, E, F, Fut, O>(
    policy: &RetryPolicy,
    deadline: &Deadline,
    what: &str,
    mut op: F,
    mut observe: O,
) -> Result<T, RetryError<E>>
where
    E: Display,
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Attempt<T, E>>,
    O: FnMut(&Retrying<'_, E>),
{
    let mut attempt = 1;
    loop {
        let (error, after) = match op(attempt).await {
            Attempt::Done(value) => return Ok(value),
            Attempt::Fatal(error) => return Err(RetryError::Fatal(error)),
            Attempt::Retry { error, after } => (error, after),
        };
        let delay = policy
            .delay(attempt, random_unit())
            .max(after.unwrap_or_default());
        if !policy.0.may_retry_after(attempt) || delay >= deadline.remaining() {
            return Err(RetryError::GaveUp {
                attempts: attempt,
                last: error,
            });
        }
        log::warn!(
            "{what}: attempt {attempt} failed: {error}; retrying in {:.1}s",
            delay.as_secs_f64()
        );
        observe(&Retrying {
            attempt,
            error: &error,
            delay,
        });
        tokio::time::sleep(delay).await;
        attempt += 1;
    }
}

/// A random number in [0, 1): jitter needs no cryptographic randomness, and
/// the standard library's hasher keys are randomly seeded per process. Each
/// draw hashes the next number of a count, not the time: the agent reads
/// wall time only through its one clock.
pub fn random_unit() -> f64 {
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = RetryPolicy(Backoff {
            jitter: 0.0,
            ..RetryPolicy::JOIN.0
        });
        let delays: Vec<u64> = (1..=7).map(|n| policy.delay(n, 0.9).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(policy.delay(u32::MAX, 0.5), policy.0.cap);
    }

    #[test]
    fn jitter_only_shortens() {
        let policy = RetryPolicy::JOIN;
        assert_eq!(policy.delay(3, 0.0), Duration::from_secs(4));
        assert_eq!(policy.delay(3, 1.0), Duration::from_secs(2));
        for _ in 0..100 {
            let r = random_unit();
            assert!((0.0..1.0).contains(&r));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stops_at_the_deadline_and_on_fatal() {
        let deadline = Deadline::after(Duration::from_secs(10));
        let result: Result<(), _> = retry(&RetryPolicy::JOIN, &deadline, "t", |_| async {
            Attempt::<(), _>::Retry {
                error: "down",
                after: None,
            }
        })
        .await;
        assert!(
            matches!(result, Err(RetryError::GaveUp { attempts, .. }) if (3..=6).contains(&attempts))
        );
        let result: Result<(), _> = retry(&RetryPolicy::JOIN, &deadline, "t", |_| async {
            Attempt::<(), _>::Fatal("no")
        })
        .await;
        assert!(matches!(result, Err(RetryError::Fatal("no"))));
    }

    #[tokio::test(start_paused = true)]
    async fn honours_retry_after_and_max_attempts() {
        let deadline = Deadline::after(Duration::from_secs(600));
        let start = tokio::time::Instant::now();
        let result = retry(&RetryPolicy::JOIN, &deadline, "t", |n| async move {
            if n < 2 {
                Attempt::Retry {
                    error: "busy",
                    after: Some(Duration::from_secs(20)),
                }
            } else {
                Attempt::Done(n)
            }
        })
        .await;
        assert_eq!(result.unwrap(), 2);
        assert!(start.elapsed() >= Duration::from_secs(20));
        let result: Result<(), _> = retry(&RetryPolicy::REPORT, &deadline, "t", |_| async {
            Attempt::<(), _>::Retry {
                error: "x",
                after: None,
            }
        })
        .await;
        assert!(matches!(
            result,
            Err(RetryError::GaveUp { attempts: 3, .. })
        ));
    }
}
