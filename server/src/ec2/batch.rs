//! Many lookups, few calls: one `DescribeInstances` answers up to
//! [`MAX_IDS`] lookups that wait at the same time.
//!
//! Why: EC2 budgets `DescribeInstances` per account and region (by AWS's
//! published defaults a bucket of 100 requests refilled at 20 a second for
//! the non-mutating calls), and Karpenter draws on the same budget. Asked
//! once an instance, 10,000 nodes renewing together took about 500 s of it
//! and throttled the autoscaler meanwhile; batched, a few hundred calls.
//!
//! How: a region's calls are budgeted (`--ec2-calls-per-second`,
//! [`DEFAULT_CALLS_PER_SECOND`] unless set) with a burst of as many, and
//! at most [`CALLS_IN_FLIGHT`] out at once. A lookup is sent at once while the budget allows, so a quiet server adds no wait to
//! a join; past it, lookups queue, and each call that goes next takes up
//! to [`MAX_IDS`] of them: the busier the server, the fuller its calls,
//! and never more calls than the budget, however many nodes renew at once.
//!
//! A failed call is not every instance's answer. EC2 fails a whole call
//! for one ID it does not know (an instance too new for its eventual
//! consistency, or long gone) and for one in an Availability Zone it
//! cannot reach; a batch failed so is asked again one instance at a time,
//! exactly as before batching, so each lookup gets its own answer and one
//! instance costs no other its join or renewal. Throttling and refused or
//! missing credentials are everyone's answer as they are: asking again one
//! at a time would only spend more of the budget.
//!
//! Bounds: at most the budget's calls of a region a second and
//! [`CALLS_IN_FLIGHT`] at once, a failed batch's single lookups included
//! (made one after the other by its call, each within the budget); the
//! queue holds one entry a waiting caller, and callers are bounded where
//! they start (joins by `--max-concurrent-joins`, the approver by its
//! concurrency).

use super::client::Ec2Client;
use super::{is_instance_id, the_one, Ec2Instance, InstanceLookup, LookupError, LookupFuture};
use crate::primitives::limiter::{Bucket, Rate};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Instance IDs in one call. EC2 takes more, but an answer's size grows
/// with them (one instance with many interfaces is tens of KiB), and 50
/// already makes a 10,000-node wave 200 calls.
pub const MAX_IDS: usize = 50;
/// Calls of one region out at once. More than one, so one slow answer
/// (EC2's timeout is seconds) does not hold every lookup behind it.
pub const CALLS_IN_FLIGHT: usize = 4;
/// Calls of one region a second, and the burst, unless
/// `--ec2-calls-per-second` says otherwise: half of what AWS refills an
/// account's `DescribeInstances` bucket with by default (20 a second),
/// leaving the rest to Karpenter. At [`MAX_IDS`] a call, 500 lookups a
/// second.
pub const DEFAULT_CALLS_PER_SECOND: u32 = 10;

/// The boxed future [`DescribeMany::describe_many`] returns.
pub type ManyFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Ec2Instance>, LookupError>> + Send + 'a>>;

/// One `DescribeInstances` for several instances; failing as a whole as
/// EC2 does. [`Ec2Client`] is the real one.
pub trait DescribeMany: Send + Sync + 'static {
    fn describe_many<'a>(&'a self, region: &'a str, instance_ids: &'a [&'a str]) -> ManyFuture<'a>;
}

impl DescribeMany for Ec2Client {
    fn describe_many<'a>(&'a self, region: &'a str, instance_ids: &'a [&'a str]) -> ManyFuture<'a> {
        Box::pin(Ec2Client::describe_many(self, region, instance_ids))
    }
}

/// An [`InstanceLookup`] that batches the lookups waiting together.
pub struct Batched {
    shared: Arc<Shared>,
}

struct Shared {
    ec2: Arc<dyn DescribeMany>,
    /// Each region's budget, as the one token bucket's rate.
    budget: Rate,
    regions: Mutex<HashMap<String, Region>>,
}

/// A region's lookups waiting, its calls out and its budget. Removed once
/// it has none of the first two and its budget is whole again, so nothing
/// is lost by forgetting it (regions come from AWS-signed documents and
/// the server's own bindings: a few dozen at most).
struct Region {
    waiting: VecDeque<Waiter>,
    calls: usize,
    budget: Bucket,
}

impl Region {
    fn new(budget: Rate, now: Instant) -> Self {
        Self {
            waiting: VecDeque::new(),
            calls: 0,
            budget: Bucket::full(budget, now),
        }
    }

    /// Whether forgetting it loses nothing.
    fn idle(&self, budget: Rate, now: Instant) -> bool {
        self.calls == 0 && self.waiting.is_empty() && self.budget.is_full(budget, now)
    }
}

type Answer = Result<Ec2Instance, LookupError>;

struct Waiter {
    instance_id: String,
    answer: oneshot::Sender<Answer>,
}

impl Batched {
    /// Lookups through `ec2`, at most `calls_per_second` calls of a region
    /// a second (and a burst of as many; at least one).
    pub fn new(ec2: Arc<dyn DescribeMany>, calls_per_second: u32) -> Self {
        let calls_per_second = calls_per_second.max(1);
        Self {
            shared: Arc::new(Shared {
                ec2,
                budget: Rate::new(calls_per_second, Duration::from_secs(1) / calls_per_second),
                regions: Mutex::default(),
            }),
        }
    }
}

impl InstanceLookup for Batched {
    fn describe_instance<'a>(&'a self, region: &'a str, instance_id: &'a str) -> LookupFuture<'a> {
        Box::pin(async move {
            // Refused here, not in a batch, where it would fail the others'
            // call: the ID is the caller's until EC2 has answered for it.
            if !is_instance_id(instance_id) {
                return Err(LookupError::not_found(instance_id));
            }
            let (answer, answered) = oneshot::channel();
            let waiter = Waiter {
                instance_id: instance_id.to_string(),
                answer,
            };
            if self.shared.enqueue(region, waiter) {
                tokio::spawn(self.shared.clone().call(region.to_string()));
            }
            answered.await.unwrap_or_else(|_| {
                Err(LookupError::Unavailable(
                    "the lookup ended without an answer".into(),
                ))
            })
        })
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Region>> {
        // Every change below is a push, a drain or a count, whole.
        self.regions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `waiter`; true if a call should start for it (fewer than
    /// [`CALLS_IN_FLIGHT`] are out), counted as out from now.
    fn enqueue(&self, region: &str, waiter: Waiter) -> bool {
        let mut regions = self.lock();
        let queue = regions
            .entry(region.to_string())
            .or_insert_with(|| Region::new(self.budget, Instant::now()));
        queue.waiting.push_back(waiter);
        let start = queue.calls < CALLS_IN_FLIGHT;
        if start {
            queue.calls += 1;
        }
        start
    }

    /// One call's life: asks for the waiting lookups, up to [`MAX_IDS`] at
    /// a time, each call within the region's budget, until none wait.
    async fn call(self: Arc<Self>, region: String) {
        let mut out = Out {
            shared: &self,
            region: &region,
            counted: true,
        };
        while out.anything_waiting() {
            // Lookups arriving while it waits for the budget join its batch.
            self.within_budget(&region).await;
            let Some(batch) = out.next_batch() else {
                break;
            };
            self.answer(&region, batch).await;
        }
    }

    /// Takes one call of `region`'s budget, waiting for it if spent.
    async fn within_budget(&self, region: &str) {
        loop {
            let taken = match self.lock().get_mut(region) {
                Some(queue) => queue.budget.take(self.budget, Instant::now()),
                // Forgotten only when idle: no call of this one's is out.
                None => Ok(()),
            };
            match taken {
                Ok(()) => return,
                Err(pause) => tokio::time::sleep(pause).await,
            }
        }
    }

    async fn answer(&self, region: &str, batch: Vec<Waiter>) {
        let mut ids: Vec<&str> = batch.iter().map(|w| w.instance_id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        let answers: HashMap<String, Answer> = match self.ec2.describe_many(region, &ids).await {
            Ok(found) => found
                .into_iter()
                .map(|instance| (instance.instance_id.clone(), Ok(instance)))
                .collect(),
            Err(error) if ids.len() > 1 && !shared_by_all(&error) => {
                tracing::debug!(region, instances = ids.len(), %error, "a batched EC2 lookup failed; asking for each instance alone");
                self.one_at_a_time(region, &ids).await
            }
            Err(error) => ids
                .iter()
                .map(|id| (id.to_string(), Err(error.clone())))
                .collect(),
        };
        for waiter in batch {
            let answer = answers
                .get(&waiter.instance_id)
                .cloned()
                .unwrap_or_else(|| Err(LookupError::not_found(&waiter.instance_id)));
            // A caller that stopped waiting dropped its receiver; nothing to do.
            let _ = waiter.answer.send(answer);
        }
    }

    /// Each of `ids` in a call of its own, one after the other, each within
    /// the budget: a failed batch costs the budget no more than unbatched
    /// lookups would have.
    async fn one_at_a_time(&self, region: &str, ids: &[&str]) -> HashMap<String, Answer> {
        let mut answers = HashMap::new();
        for id in ids {
            self.within_budget(region).await;
            let answer = self
                .ec2
                .describe_many(region, &[id])
                .await
                .and_then(|found| the_one(found, id));
            answers.insert(id.to_string(), answer);
        }
        answers
    }
}

/// Errors that are every instance's alike: asking one at a time could not
/// change them, only spend more of EC2's budget.
fn shared_by_all(error: &LookupError) -> bool {
    matches!(
        error,
        LookupError::Throttled | LookupError::Denied(_) | LookupError::Credentials(_)
    )
}

/// A call counted as out in its region until it finds nothing waiting,
/// or until it ends otherwise (a panic): then its count is given back, and
/// if it was the region's last call, whoever still waits is told so rather
/// than left waiting for a call that will not come.
struct Out<'a> {
    shared: &'a Shared,
    region: &'a str,
    counted: bool,
}

impl Out<'_> {
    /// Whether lookups wait; if none do, the call is no longer counted.
    fn anything_waiting(&mut self) -> bool {
        let mut regions = self.shared.lock();
        let waiting = regions
            .get(self.region)
            .is_some_and(|queue| !queue.waiting.is_empty());
        if !waiting {
            self.done(&mut regions);
        }
        waiting
    }

    /// The call ends with nothing waiting: uncounted, and the region
    /// forgotten if that loses nothing.
    fn done(&mut self, regions: &mut HashMap<String, Region>) {
        let now = Instant::now();
        if let Some(queue) = regions.get_mut(self.region) {
            queue.calls = queue.calls.saturating_sub(1);
            if queue.idle(self.shared.budget, now) {
                regions.remove(self.region);
            }
        }
        self.counted = false;
    }

    /// The next lookups to ask for, up to [`MAX_IDS`] IDs; `None`, with
    /// the call no longer counted, when none wait.
    fn next_batch(&mut self) -> Option<Vec<Waiter>> {
        let mut regions = self.shared.lock();
        let Some(queue) = regions
            .get_mut(self.region)
            .filter(|queue| !queue.waiting.is_empty())
        else {
            self.done(&mut regions);
            return None;
        };
        let mut batch = Vec::new();
        let mut ids = std::collections::HashSet::new();
        while let Some(next) = queue.waiting.front() {
            if !ids.contains(next.instance_id.as_str()) && ids.len() == MAX_IDS {
                break;
            }
            ids.insert(next.instance_id.clone());
            batch.extend(queue.waiting.pop_front());
        }
        Some(batch)
    }
}

impl Drop for Out<'_> {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut regions = self.shared.lock();
        let Some(queue) = regions.get_mut(self.region) else {
            return;
        };
        queue.calls = queue.calls.saturating_sub(1);
        if queue.calls == 0 {
            for waiter in queue.waiting.drain(..) {
                let _ = waiter.answer.send(Err(LookupError::Unavailable(
                    "the EC2 lookup's call ended early".into(),
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec2::tests::running as instance;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::Semaphore;

    /// EC2 as it answers a batch: every instance it knows, or, for one ID
    /// it does not know, `InvalidInstanceID.NotFound` for the whole call.
    /// Records each call's IDs; holds each call until `gate` lets it go.
    struct Fake {
        known: fn(&str) -> bool,
        calls: Mutex<Vec<Vec<String>>>,
        gate: Semaphore,
        throttled: AtomicBool,
    }

    impl Fake {
        fn new(known: fn(&str) -> bool, open: bool) -> Arc<Self> {
            Arc::new(Self {
                known,
                calls: Mutex::default(),
                gate: Semaphore::new(if open { Semaphore::MAX_PERMITS } else { 0 }),
                throttled: AtomicBool::new(false),
            })
        }

        fn calls(&self) -> Vec<Vec<String>> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl DescribeMany for Fake {
        fn describe_many<'a>(&'a self, _: &'a str, ids: &'a [&'a str]) -> ManyFuture<'a> {
            self.calls
                .lock()
                .unwrap()
                .push(ids.iter().map(|id| id.to_string()).collect());
            Box::pin(async move {
                let _pass = self.gate.acquire().await.unwrap();
                if self.throttled.load(Ordering::SeqCst) {
                    return Err(LookupError::Throttled);
                }
                if let Some(unknown) = ids.iter().find(|id| !(self.known)(id)) {
                    return Err(LookupError::not_found(unknown));
                }
                Ok(ids.iter().map(|id| instance(id)).collect())
            })
        }
    }

    fn id(n: usize) -> String {
        format!("i-{n:08x}")
    }

    fn everyone(_: &str) -> bool {
        true
    }

    /// Starts `ids`' lookups, each in a task of its own.
    fn look_up(
        batched: &Arc<Batched>,
        ids: impl IntoIterator<Item = String>,
    ) -> Vec<tokio::task::JoinHandle<(String, Answer)>> {
        ids.into_iter()
            .map(|id| {
                let batched = batched.clone();
                tokio::spawn(async move {
                    let answer = batched.describe_instance("us-west-2", &id).await;
                    (id, answer)
                })
            })
            .collect()
    }

    /// Lets the scheduler run every task that can run.
    async fn settle() {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }

    /// Puts [`CALLS_IN_FLIGHT`] calls out, one lookup each, held at the
    /// gate. (Lookups started together go in one call: the first call
    /// takes every lookup waiting when it starts.)
    async fn hold_every_call(
        batched: &Arc<Batched>,
        ec2: &Fake,
    ) -> Vec<tokio::task::JoinHandle<(String, Answer)>> {
        let mut held = Vec::new();
        for n in 0..CALLS_IN_FLIGHT {
            held.extend(look_up(batched, [id(n)]));
            settle().await;
            assert_eq!(ec2.calls().len(), n + 1);
        }
        held
    }

    /// Once answered, no lookup waits and soon no call is out (a call may
    /// still wait for the budget, to find nothing left; the region is kept
    /// while its budget refills).
    async fn assert_quiet(batched: &Batched) {
        let busy = || {
            batched
                .shared
                .lock()
                .values()
                .map(|region| (region.calls, region.waiting.len()))
                .find(|&busy| busy != (0, 0))
        };
        for _ in 0..200 {
            if busy().is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("calls out, lookups waiting: {:?}", busy());
    }

    /// Holds every call out, queues `ids`' lookups behind them, then lets
    /// EC2 answer: every lookup's answer, the held ones' first.
    async fn behind_busy_calls(
        ec2: &Arc<Fake>,
        ids: impl IntoIterator<Item = String>,
    ) -> Vec<(String, Answer)> {
        let batched = Arc::new(Batched::new(ec2.clone(), DEFAULT_CALLS_PER_SECOND));
        let held = hold_every_call(&batched, ec2).await;
        let queued = look_up(&batched, ids);
        settle().await;
        assert_eq!(
            ec2.calls().len(),
            CALLS_IN_FLIGHT,
            "none sent while all are out"
        );
        ec2.gate.add_permits(Semaphore::MAX_PERMITS / 2);
        let answers = futures::future::join_all(held.into_iter().chain(queued)).await;
        assert_quiet(&batched).await;
        answers.into_iter().map(|task| task.unwrap()).collect()
    }

    #[tokio::test]
    async fn a_lookup_alone_is_asked_at_once_alone() {
        let ec2 = Fake::new(everyone, true);
        let batched = Batched::new(ec2.clone(), DEFAULT_CALLS_PER_SECOND);
        let found = batched
            .describe_instance("us-west-2", &id(1))
            .await
            .unwrap();
        assert_eq!(found.instance_id, id(1));
        assert_eq!(ec2.calls(), vec![vec![id(1)]]);
        assert_quiet(&batched).await;
    }

    #[tokio::test]
    async fn lookups_waiting_behind_busy_calls_go_together_each_answered_for_itself() {
        let ec2 = Fake::new(everyone, false);
        // Waiting behind the calls out: 120 lookups, the first of them twice.
        let waiting = [id(100)].into_iter().chain((100..220).map(id));
        for (asked, answer) in behind_busy_calls(&ec2, waiting).await {
            assert_eq!(answer.unwrap().instance_id, asked, "each gets its own");
        }
        let calls = ec2.calls();
        let batches = &calls[CALLS_IN_FLIGHT..];
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(
            sizes.iter().sum::<usize>(),
            120,
            "each instance asked once: {sizes:?}"
        );
        assert!(sizes.iter().all(|&n| n <= MAX_IDS), "{sizes:?}");
        assert_eq!(batches.len(), 3, "120 in calls of at most 50: {sizes:?}");
    }

    #[tokio::test]
    async fn one_unknown_instance_costs_the_others_nothing() {
        fn known(id: &str) -> bool {
            id != "i-000000ff"
        }
        let ec2 = Fake::new(known, false);
        for (asked, answer) in behind_busy_calls(&ec2, (250..260).map(id)).await {
            match answer {
                Ok(found) => assert_eq!(found.instance_id, asked),
                Err(LookupError::NotFound { instance_id }) => {
                    assert_eq!(
                        (asked.as_str(), instance_id.as_str()),
                        ("i-000000ff", "i-000000ff")
                    )
                }
                Err(other) => panic!("{asked}: {other}"),
            }
        }
        // The failed batch of 10, then each of its 10 alone.
        let calls = ec2.calls();
        assert_eq!(calls.len(), CALLS_IN_FLIGHT + 1 + 10, "{calls:?}");
        assert!(calls[CALLS_IN_FLIGHT + 1..]
            .iter()
            .all(|call| call.len() == 1));
    }

    #[tokio::test]
    async fn throttling_is_every_lookups_answer_and_not_asked_again_one_at_a_time() {
        let ec2 = Fake::new(everyone, false);
        ec2.throttled.store(true, Ordering::SeqCst);
        for (asked, answer) in behind_busy_calls(&ec2, (300..310).map(id)).await {
            assert!(matches!(answer, Err(LookupError::Throttled)), "{asked}");
        }
        assert_eq!(ec2.calls().len(), CALLS_IN_FLIGHT + 1);
    }

    #[tokio::test]
    async fn an_id_that_is_not_an_instance_id_never_joins_a_batch() {
        let ec2 = Fake::new(everyone, true);
        let batched = Batched::new(ec2.clone(), DEFAULT_CALLS_PER_SECOND);
        let refused = batched
            .describe_instance("us-west-2", "i-1&Action=RunInstances")
            .await;
        assert!(matches!(refused, Err(LookupError::NotFound { .. })));
        assert!(ec2.calls().is_empty());
    }

    #[tokio::test]
    async fn a_call_that_ends_early_leaves_nobody_waiting() {
        let ec2 = Fake::new(everyone, false);
        let batched = Arc::new(Batched::new(ec2.clone(), DEFAULT_CALLS_PER_SECOND));
        let first = hold_every_call(&batched, &ec2).await;
        let rest = look_up(&batched, (400..405).map(id));
        settle().await;
        // The calls' tasks die with their runtime's shutdown here: stand in
        // by ending each call as a panic would, through its guard.
        for _ in 0..CALLS_IN_FLIGHT {
            drop(Out {
                shared: &batched.shared,
                region: "us-west-2",
                counted: true,
            });
        }
        for task in rest {
            let (asked, answer) = task.await.unwrap();
            assert!(
                matches!(answer, Err(LookupError::Unavailable(_))),
                "{asked}"
            );
        }
        drop(first);
    }

    #[tokio::test]
    async fn calls_stay_within_the_budget_however_the_lookups_come() {
        // The default, and a budget as `--ec2-calls-per-second=3` sets it.
        for budget in [DEFAULT_CALLS_PER_SECOND, 3] {
            let ec2 = Fake::new(everyone, true);
            let batched = Arc::new(Batched::new(ec2.clone(), budget));
            // One lookup every 10 ms, each of which EC2 answers at once:
            // alone, each would be a call, 100 a second.
            let started = Instant::now();
            let mut lookups = Vec::new();
            for n in 0..150 {
                lookups.extend(look_up(&batched, [id(n)]));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for task in lookups {
                let (asked, answer) = task.await.unwrap();
                assert_eq!(answer.unwrap().instance_id, asked);
            }
            let seconds = started.elapsed().as_secs_f64();
            let calls = ec2.calls();
            let allowed = f64::from(budget) * (1.0 + seconds) + 1.0;
            assert!(
                (calls.len() as f64) <= allowed,
                "{} calls in {seconds:.2} s, budget {budget} a second",
                calls.len()
            );
            assert_eq!(calls.iter().map(Vec::len).sum::<usize>(), 150);
            assert_quiet(&batched).await;
        }
    }
}
