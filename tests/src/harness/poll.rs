//! Polling until something holds: the one loop behind every wait of the
//! harness and the tests (a daemon answering, an object reaching a state,
//! a log line or an Event showing up).
//!
//! What the cluster does happens in the background (controllers, watches,
//! caches catching up), so a test looks again and again until it sees what
//! it waits for, within a bound. Written once here, every wait looks the
//! same way: the probe first, then the deadline, then the pause; a probe
//! that fails stops the wait at once, since looking again would only hide
//! the failure behind a timeout.
//!
//! A timeout says what was awaited, for how long and, if the probe said
//! so ([`Seen`]), what was there instead at the last look ([`TimedOut`]);
//! what else a caller knows then (logs) it adds with
//! [`OnTimeout::on_timeout`], which leaves the probe's own errors as they
//! are.

use anyhow::Result;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// Calls `probe` every `every` until a look finds the value awaited, and
/// returns it.
///
/// A look is an `Option` (the value, or `None` for not yet) or a [`Seen`]
/// (which also says what was there instead). Fails with [`TimedOut`] ("no
/// {what} after {within:?}", then "; " and the last look's [`Seen`]
/// words) once `within` has passed without the value, so `what` names
/// what is waited for ("Ready EC2NodeClass"); fails at once with the
/// probe's error if it returns one. The probe always runs at least once,
/// and its last look is after `within` has passed: a timeout means it was
/// still not there then.
pub async fn until<L, F, Fut>(
    what: &str,
    within: Duration,
    every: Duration,
    mut probe: F,
) -> Result<L::Value>
where
    L: Look,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<L>>,
{
    let deadline = Instant::now() + within;
    loop {
        let saw = match probe().await?.found() {
            Ok(value) => return Ok(value),
            Err(saw) => saw,
        };
        if Instant::now() > deadline {
            let detail = if saw.is_empty() {
                saw
            } else {
                format!("; {saw}")
            };
            return Err(TimedOut {
                what: what.to_string(),
                within,
                detail,
            }
            .into());
        }
        tokio::time::sleep(every).await;
    }
}

/// What one look of [`until`]'s probe found: the value awaited, or not
/// yet.
pub trait Look {
    /// The value awaited.
    type Value;
    /// The value, or what was there instead (empty: nothing to say).
    fn found(self) -> std::result::Result<Self::Value, String>;
}

/// The value, or `None` for not yet.
impl<T> Look for Option<T> {
    type Value = T;
    fn found(self) -> std::result::Result<T, String> {
        self.ok_or_else(String::new)
    }
}

/// A look that says what it saw when the value was not there (the
/// object's state, the last refusal), for the timeout's message.
pub struct Seen<T>(
    /// The value, or `None` for not yet.
    pub Option<T>,
    /// What was there instead.
    pub String,
);

impl<T> Look for Seen<T> {
    type Value = T;
    fn found(self) -> std::result::Result<T, String> {
        self.0.ok_or(self.1)
    }
}

/// [`until`]'s error when the bound passed without a value.
#[derive(Debug, thiserror::Error)]
#[error("no {what} after {within:?}{detail}")]
pub struct TimedOut {
    /// What was awaited.
    pub what: String,
    /// How long.
    pub within: Duration,
    /// What the last look saw ([`Seen`]) and the callers added
    /// ([`OnTimeout::on_timeout`]), each opening with its separator.
    pub detail: String,
}

/// Adds what the caller knows to a wait's [`TimedOut`].
pub trait OnTimeout<T> {
    /// A timeout with `detail` added to its message as it is (so `detail`
    /// opens with its separator: `":\n"` before a log, `"; "` before a
    /// state), still a [`TimedOut`] for a caller further up to add to; any
    /// other error, and a value, unchanged. `detail` runs only on a
    /// timeout, when the logs and the last state seen are worth reading.
    fn on_timeout(self, detail: impl FnOnce() -> String) -> Result<T>;
}

impl<T> OnTimeout<T> for Result<T> {
    fn on_timeout(self, detail: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| {
            // A bare timeout only: downcasting one under a context would
            // drop the context.
            if e.chain().count() > 1 {
                return e;
            }
            match e.downcast::<TimedOut>() {
                Ok(mut timeout) => {
                    timeout.detail.push_str(&detail());
                    timeout.into()
                }
                Err(other) => other,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::anyhow;
    use std::cell::Cell;

    const EVERY: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn yields_the_probes_value_once_there_is_one() {
        let looks = Cell::new(0);
        let value = until("a third look", Duration::from_secs(10), EVERY, || async {
            looks.set(looks.get() + 1);
            Ok((looks.get() == 3).then_some(looks.get() * 10))
        })
        .await
        .expect("a value within the bound");
        assert_eq!((value, looks.get()), (30, 3));
    }

    #[tokio::test]
    async fn times_out_naming_what_was_awaited() {
        let looks = Cell::new(0);
        let started = std::time::Instant::now();
        let within = Duration::from_millis(30);
        let outcome = until::<Option<()>, _, _>("green light", within, EVERY, || async {
            looks.set(looks.get() + 1);
            Ok(None)
        })
        .await;
        let error = outcome.expect_err("no value, ever");
        assert!(error.is::<TimedOut>(), "{error:#}");
        assert_eq!(
            format!("{error:#}"),
            format!("no green light after {within:?}")
        );
        assert!(started.elapsed() >= within, "gave up early");
        assert!(looks.get() >= 2, "looked {} times", looks.get());
    }

    #[tokio::test]
    async fn a_probe_error_fails_at_once_as_it_is() {
        let looks = Cell::new(0);
        let within = Duration::from_secs(10);
        let outcome = until::<Option<()>, _, _>("anything", within, EVERY, || async {
            looks.set(looks.get() + 1);
            Err(anyhow!("refused").context("listing"))
        })
        .await
        .on_timeout(|| unreachable!("not a timeout"));
        let message = format!("{:#}", outcome.expect_err("the probe's error"));
        assert_eq!(message, "listing: refused");
        assert_eq!(looks.get(), 1, "looked again after an error");
    }

    #[tokio::test]
    async fn a_zero_bound_still_looks_once() {
        let value = until("a first look", Duration::ZERO, EVERY, || async {
            Ok(Some(7))
        })
        .await
        .expect("a value on the first look");
        assert_eq!(value, 7);
    }

    #[tokio::test]
    async fn a_timeout_says_what_the_last_look_saw() {
        let looks = Cell::new(0);
        let within = Duration::from_millis(10);
        let timeout = until("green light", within, EVERY, || async {
            looks.set(looks.get() + 1);
            Ok(Seen::<()>(None, format!("red, look {}", looks.get())))
        })
        .await;
        let message = format!("{:#}", timeout.expect_err("a timeout"));
        let last = looks.get();
        assert_eq!(
            message,
            format!("no green light after {within:?}; red, look {last}")
        );

        let found = until("a value", Duration::ZERO, EVERY, || async {
            Ok(Seen(Some(5), "unread".to_string()))
        })
        .await
        .expect("the value");
        assert_eq!(found, 5);
    }

    #[tokio::test]
    async fn a_timeout_is_explained_by_each_caller_in_turn() {
        let nothing = || async { Ok(None::<()>) };
        let timeout = until("fourth", Duration::ZERO, EVERY, nothing)
            .await
            .on_timeout(|| "; saw 3".to_string())
            .on_timeout(|| ":\nthe log".to_string());
        let message = format!("{:#}", timeout.expect_err("a timeout"));
        assert_eq!(message, "no fourth after 0ns; saw 3:\nthe log");
    }
}
