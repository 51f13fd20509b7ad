//! The join queue's length in time: how fast places free up, whether a
//! newcomer would get one within the queue's wait, and when to tell one
//! that would not to come back.
//!
//! Why: with far more machines at once than places (5,000 against 256), a
//! join at the back of the queue waits minutes. Queued anyway, it held its
//! connection's buffers for the whole `--join-queue-wait`, was told 503
//! with a fixed 2 s, and came back after the agent's growing backoff, over
//! and over: each return a TLS handshake and an admission, the server's
//! memory growing with the connections waiting. Now a join that the queue
//! cannot serve within its wait is told at once, with a `Retry-After` at
//! its turn: each one turned away gets the next free moment after the
//! queue ahead of it has drained, at the rate the places serve (the rate
//! they have been freeing, or by Little's law the places held over a join's
//! time in one, whichever is higher: see [`Measured`]), so the fleet comes
//! back spread out at the pace the API server takes it. Agents since 0.2.0
//! wait `max(backoff, Retry-After)`.
//!
//! Only admitted joins (verified, within policy) are queued or scheduled,
//! so a caller without a valid document moves nothing here, and an
//! instance holds one turn however often its document is sent. Every
//! moment given is at most [`MAX_RETRY_AFTER`] away, or, for an agent that
//! says how long it will keep trying (since 0.3.0), at most that less a
//! minute and never more than [`MAX_PATIENT_RETRY_AFTER`]: told 30 s at
//! most, the back of a 10,000-machine burst came back a dozen times.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The longest `Retry-After` given to an agent that does not say how long
/// it will keep trying: the agent's own longest backoff (`RetryPolicy::JOIN`'s
/// cap, the same in every released agent), so no agent waits longer than
/// it would have on its own, and one with a short `deadline` gives up no
/// sooner. Joins whose turn is further come back and are given a later one.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// The longest `Retry-After` given to an agent that says how long it will
/// keep trying ([`PATIENCE_HEADER`], agents since 0.3.0): a 10,000-machine
/// burst's last joins wait about six minutes here, and told at most 30 s,
/// each came back a dozen times, every return a TLS handshake and an
/// admission (docs/benchmarks.md).
///
/// [`PATIENCE_HEADER`]: autonode_shared::protocol::PATIENCE_HEADER
pub const MAX_PATIENT_RETRY_AFTER: Duration = Duration::from_secs(300);
/// Kept off an agent's patience: its next attempt (a challenge, a join, a
/// TLS handshake each) must fit before its deadline, or it gives up.
const PATIENCE_MARGIN: Duration = Duration::from_secs(60);

/// Turns are told this many times faster than places have been freeing.
/// At exactly the measured rate the fleet would come back at that rate and
/// never show the queue more: a rate measured while the API server was
/// slow would hold the whole burst to it (a 5,000-join burst paced so took
/// 290 s where it took 140). The surplus keeps the queue full, so the
/// rate measured can rise; what the queue cannot hold is told a later turn.
const PACE: f64 = 1.5;
/// Turns told and not yet come that are remembered, one an instance: more
/// than the largest burst measured (10,000), a few MiB at most. Past it a
/// join is told a moment at random, as past the cap.
const MAX_TURNS: usize = 20_000;
/// The fewest that may wait while the rate is not known, however few the
/// places: that many connections' buffers are a few MiB.
const MIN_QUEUE: usize = 64;
/// Joins finished that the rate is measured over.
const RATE_SAMPLES: usize = 256;
/// Finished joins older than this say nothing about the rate now.
const RATE_WINDOW: Duration = Duration::from_secs(30);
/// Fewer finished joins than this in the window: the rate is not known,
/// and every join waits its turn as if the queue had room.
const RATE_MIN_SAMPLES: usize = 16;

/// The queue's measure, shared by every join.
pub struct Queue {
    /// How long an admitted join may wait for a place.
    wait: Duration,
    /// How many may wait while the rate is not known: as many as there
    /// are places (`--max-concurrent-joins`), and at least [`MIN_QUEUE`].
    unmeasured: usize,
    /// The `Retry-After` when the queue has room (a join turned away by its
    /// source's cap, or one whose wait ran out).
    floor: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The last joins to give their places back, oldest first.
    finished: VecDeque<Finished>,
    /// Places held now.
    holding: usize,
    /// Joins waiting for a place now.
    waiting: usize,
    /// The last moment handed to a join turned away.
    last_slot: Option<Instant>,
    /// The turn each instance was told and that has not come yet: asked
    /// again (a join back early, or a leaked document sent over and over),
    /// it is told the same turn, so one document holds one turn and
    /// cannot push every other join's turn back.
    turns: HashMap<String, Instant>,
    /// The same turns in the order told, which is their order in time.
    told: VecDeque<(Instant, String)>,
}

/// A join turned away: the instance its (verified) document names, and
/// how long its agent says it will keep trying.
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    pub instance: &'a str,
    pub patience: Option<Duration>,
}

/// A join waiting for a place; counted until dropped.
pub struct Waiting(Arc<Queue>);

/// A join holding a place since the instant; when dropped, the place's
/// release is counted into the rate.
pub struct Holding(Arc<Queue>, Instant);

/// A join that gave its place back: when, after how long, and how many
/// places were held just before (itself included).
#[derive(Clone, Copy, Debug)]
struct Finished {
    at: Instant,
    held_for: Duration,
    held: usize,
}

/// What the finished joins in the window say about the rate.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Measured {
    /// Places freed a second: the releases counted over the time they
    /// took. What the queue's room is measured by.
    freed: f64,
    /// The rate turns are told at, before [`PACE`]: the higher of `freed`
    /// and Little's law (the places held over the time a join holds one).
    /// In a burst's first seconds the releases are few and spread (the
    /// first joins of a cold API server finish early, the rest together
    /// later): `freed` then reads a fraction of what the places serve, and
    /// turns told at it would hold the whole burst to it (turns told are
    /// never moved: a 5,000-join burst paced so took 276 s where it took
    /// 150). Little's law reads the places' rate from the first joins.
    pace: f64,
}

impl Queue {
    pub fn new(wait: Duration, floor: Duration, places: usize) -> Self {
        Self {
            wait,
            unmeasured: places.max(MIN_QUEUE),
            floor,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a join arriving `now` would likely get a place within the
    /// queue's wait: fewer wait than places free up in that time. While
    /// the rate is not known (a burst's first seconds), fewer wait than
    /// there are places (or [`MIN_QUEUE`]): each waiting connection holds
    /// its buffers, and a burst's first joins all waiting were most of the
    /// server's peak memory.
    pub fn has_room(&self, now: Instant) -> bool {
        let mut state = self.state();
        let rate = state.rate(now);
        self.room(&state, rate)
    }

    fn room(&self, state: &State, rate: Option<Measured>) -> bool {
        match rate {
            None => state.waiting < self.unmeasured,
            Some(rate) => (state.waiting as f64) < rate.freed * self.wait.as_secs_f64(),
        }
    }

    /// Counts a join as waiting until the guard is dropped.
    pub fn enter(self: &Arc<Self>) -> Waiting {
        self.state().waiting += 1;
        Waiting(self.clone())
    }

    /// Counts a place as taken; its release, when the guard is dropped.
    pub fn hold(self: &Arc<Self>) -> Holding {
        self.state().holding += 1;
        Holding(self.clone(), Instant::now())
    }

    /// How long a join turned away `now` should wait before it comes back:
    /// the floor while the queue has room; past it, the next moment after
    /// the queue ahead has drained and after every join turned away before
    /// it, at [`PACE`] times the rate places free up, at most [`Queue::longest_wait`] for an
    /// agent of the caller's patience; the same turn again to an instance
    /// that was told one which has not come yet.
    pub fn retry_after(&self, now: Instant, caller: &Caller<'_>) -> Duration {
        let cap = Self::longest_wait(caller.patience);
        let mut state = self.state();
        let rate = state.rate(now);
        if self.room(&state, rate) {
            return self.floor;
        }
        let Some(rate) = rate else {
            // A full queue of a rate not known yet: its joins are served
            // within the wait, if each place frees once in it. Back in the
            // wait's second half, spread, when it has room and a rate,
            // rather than every 2 s meanwhile, each time a handshake and an
            // admission.
            let half = self.wait / 2;
            return (half + half.mul_f64(rand::random::<f64>())).max(self.floor);
        };
        state.forget_passed(now);
        if let Some(&turn) = state.turns.get(caller.instance) {
            if turn <= now + cap {
                return (turn - now).max(self.floor);
            }
        }
        let drained = now + self.wait;
        let after = state.last_slot.map_or(drained, |last| last.max(drained));
        let slot = after + Duration::from_secs_f64(1.0 / (rate.pace * PACE));
        if slot <= now + cap && state.told.len() < MAX_TURNS {
            state.last_slot = Some(slot);
            state.turns.insert(caller.instance.to_string(), slot);
            state.told.push_back((slot, caller.instance.to_string()));
            return (slot - now).max(self.floor);
        }
        // Past the cap: a moment between the queue's drain and the cap, at
        // random, so that joins past it come back spread out and keep the
        // queue fed, where all told the cap came back together after the
        // queue had long drained and left its places idle.
        let earliest = self.wait.min(cap);
        let spread = (cap - earliest).mul_f64(rand::random::<f64>());
        (earliest + spread).max(self.floor)
    }

    /// The furthest turn an agent is told: [`MAX_RETRY_AFTER`] unless it
    /// said how long it will keep trying; then that, less the time its next
    /// attempt needs, up to [`MAX_PATIENT_RETRY_AFTER`], never less than
    /// [`MAX_RETRY_AFTER`] (its backoff would wait that long anyway).
    pub fn longest_wait(patience: Option<Duration>) -> Duration {
        patience.map_or(MAX_RETRY_AFTER, |patience| {
            patience
                .saturating_sub(PATIENCE_MARGIN)
                .clamp(MAX_RETRY_AFTER, MAX_PATIENT_RETRY_AFTER)
        })
    }
}

#[cfg(test)]
impl Queue {
    /// Joins waiting now.
    pub fn waiting_now(&self) -> usize {
        self.state().waiting
    }
}

impl State {
    /// Forgets the turns that have come by `now`.
    fn forget_passed(&mut self, now: Instant) {
        while let Some((turn, _)) = self.told.front().filter(|(turn, _)| *turn <= now) {
            let turn = *turn;
            if let Some((_, instance)) = self.told.pop_front() {
                if self.turns.get(&instance) == Some(&turn) {
                    self.turns.remove(&instance);
                }
            }
        }
    }

    /// The rate, over the last finished joins in the window.
    fn rate(&mut self, now: Instant) -> Option<Measured> {
        while self
            .finished
            .front()
            .is_some_and(|f| now.saturating_duration_since(f.at) > RATE_WINDOW)
        {
            self.finished.pop_front();
        }
        let count = self.finished.len();
        if count < RATE_MIN_SAMPLES {
            return None;
        }
        // Counted from the first release to now, not to the last: places
        // that stopped freeing lower the rate.
        let first = self.finished.front()?.at;
        let span = now.saturating_duration_since(first).as_secs_f64();
        if span <= 0.0 {
            return None;
        }
        let freed = (count - 1) as f64 / span;
        let held: usize = self.finished.iter().map(|f| f.held).sum();
        let held_for: f64 = self.finished.iter().map(|f| f.held_for.as_secs_f64()).sum();
        // Little's law: places held on average over a join's time in one.
        let little = if held_for > 0.0 {
            held as f64 / held_for
        } else {
            0.0
        };
        Some(Measured {
            freed,
            pace: freed.max(little),
        })
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.waiting = state.waiting.saturating_sub(1);
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut state = self.0.state();
        if state.finished.len() >= RATE_SAMPLES {
            state.finished.pop_front();
        }
        let held = state.holding;
        state.holding = held.saturating_sub(1);
        state.finished.push_back(Finished {
            at: now,
            held_for: now.saturating_duration_since(self.1),
            held: held.max(1),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(10);
    const FLOOR: Duration = Duration::from_secs(2);
    const PLACES: usize = 256;

    /// The `n`th of many instances, its agent of `patience`.
    fn caller(n: usize, patience: Option<Duration>) -> (String, Option<Duration>) {
        (format!("i-{n:08x}"), patience)
    }

    /// When the queue tells each of `callers` to come back, in order.
    fn told(queue: &Queue, now: Instant, callers: &[(String, Option<Duration>)]) -> Vec<Duration> {
        callers
            .iter()
            .map(|(instance, patience)| {
                queue.retry_after(
                    now,
                    &Caller {
                        instance,
                        patience: *patience,
                    },
                )
            })
            .collect()
    }

    fn many(count: usize, patience: Option<Duration>) -> Vec<(String, Option<Duration>)> {
        (0..count).map(|n| caller(n, patience)).collect()
    }

    /// A queue that saw `count` joins finish over the last `over`.
    fn measured(count: usize, over: Duration) -> (Arc<Queue>, Instant) {
        let queue = Arc::new(Queue::new(WAIT, FLOOR, PLACES));
        let now = Instant::now();
        let start = now - over;
        let step = over / count as u32;
        // Held for no time by none: only the releases' rate counts.
        queue.state().finished = (1..=count as u32)
            .map(|i| Finished {
                at: start + step * i,
                held_for: Duration::ZERO,
                held: 0,
            })
            .collect();
        (queue, now)
    }

    #[test]
    fn while_the_rate_is_unknown_as_many_wait_as_there_are_places_or_min_queue() {
        let queue = Arc::new(Queue::new(WAIT, FLOOR, PLACES));
        let now = Instant::now();
        let mut waiting: Vec<_> = (0..PLACES - 1).map(|_| queue.enter()).collect();
        assert!(queue.has_room(now));
        waiting.push(queue.enter());
        assert!(!queue.has_room(now));
        // Told to come back in the wait's second half.
        let turns = told(&queue, now, &many(100, None));
        assert!(
            turns.iter().all(|t| (WAIT / 2..=WAIT).contains(t)),
            "{turns:?}"
        );
        // However few the places, a queue of MIN_QUEUE.
        let small = Arc::new(Queue::new(WAIT, FLOOR, 1));
        let waiting: Vec<_> = (0..MIN_QUEUE - 1).map(|_| small.enter()).collect();
        assert!(small.has_room(now));
        drop(waiting);
    }

    #[test]
    fn past_what_the_wait_can_serve_joins_are_told_their_turns_one_place_apart() {
        // 20 places a second: 200 can be served within the 10 s wait.
        let (queue, now) = measured(200, Duration::from_secs(10));
        let mut waiting: Vec<_> = (0..190).map(|_| queue.enter()).collect();
        assert!(queue.has_room(now));
        assert_eq!(told(&queue, now, &many(1, None)), [FLOOR]);
        waiting.extend((0..20).map(|_| queue.enter()));
        assert!(!queue.has_room(now));
        let ms = |d: Duration| (d.as_secs_f64() * 1000.0).round() as u64;
        let turns: Vec<_> = told(&queue, now, &many(3, None))
            .into_iter()
            .map(ms)
            .collect();
        assert_eq!(turns, [10_033, 10_067, 10_100]);
        // Asked 5 s later, with no place freed since: the queue ahead
        // drains from then on, and at the lower rate (199 in 14.95 s).
        let later = now + Duration::from_secs(5);
        assert_eq!(ms(told(&queue, later, &[caller(3, None)])[0]), 10_050);
        drop(waiting);
        assert!(queue.has_room(now));
    }

    #[test]
    fn a_bursts_first_releases_do_not_hold_its_turns_to_their_rate() {
        // 256 places held. One join finished 20 s ago, in 1 s; 15 more in
        // the last second, each after 8 s in its place: 0.75 releases a
        // second since the first, but the places serve about 34 a second.
        let queue = Arc::new(Queue::new(WAIT, FLOOR, PLACES));
        let now = Instant::now();
        let release = |ago: f64, held_for: u64| Finished {
            at: now - Duration::from_secs_f64(ago),
            held_for: Duration::from_secs(held_for),
            held: PLACES,
        };
        let mut finished = vec![release(20.0, 1)];
        finished.extend((0..15).map(|i| release(1.0 - f64::from(i) / 15.0, 8)));
        queue.state().finished = finished.into();
        let rate = queue.state().rate(now).expect("16 releases: measured");
        assert!((rate.freed - 0.75).abs() < 0.01, "{rate:?}");
        // Little's law: 256 places over (1 + 15 × 8) / 16 s a join.
        assert!((rate.pace - 4096.0 / 121.0).abs() < 0.01, "{rate:?}");
        // The room still follows the releases (what waits holds memory):
        // fewer than 0.75 × 10 s may wait.
        let _waiting: Vec<_> = (0..8).map(|_| queue.enter()).collect();
        assert!(!queue.has_room(now));
        // Turns are told at the places' rate: 1,000 joins within about
        // 1,000 / (1.5 × 34) = 20 s past the drain, where at the releases'
        // rate they would be spread to the cap.
        let turns = told(&queue, now, &many(1000, Some(Duration::from_secs(600))));
        let last = turns.iter().max().copied().unwrap_or_default();
        assert!(last < WAIT + Duration::from_secs(30), "{last:?}");
    }

    #[test]
    fn turns_past_the_cap_are_spread_between_the_drain_and_the_cap() {
        // 2 places a second, turns told 3 a second: 60 fit before the 30 s
        // cap.
        let (queue, now) = measured(20, Duration::from_secs(10));
        let _waiting: Vec<_> = (0..100).map(|_| queue.enter()).collect();
        let turns = told(&queue, now, &many(1000, None));
        assert!(turns.iter().all(|t| (WAIT..=MAX_RETRY_AFTER).contains(t)));
        let ordered = turns.windows(2).take_while(|w| w[0] < w[1]).count();
        assert_eq!(ordered + 1, 60, "a third of a second apart up to the cap");
        let past: std::collections::BTreeSet<_> = turns[60..].iter().collect();
        assert!(past.len() > 100, "past the cap, spread: {past:?}");
    }

    #[test]
    fn old_finishes_do_not_count_and_places_freed_are_counted() {
        let (queue, now) = measured(100, Duration::from_secs(100));
        // Only the last 30 s (30 joins) are in the window: 1 a second.
        assert!(queue
            .state()
            .rate(now)
            .is_some_and(|r| (r.freed - 1.0).abs() < 0.05));
        let (queue, _) = measured(10, Duration::from_secs(1));
        assert_eq!(queue.state().rate(Instant::now()), None);
        drop((0..10).map(|_| queue.hold()).collect::<Vec<_>>());
        assert!(queue.state().rate(Instant::now()).is_some());
    }

    #[test]
    fn an_agent_that_says_how_long_it_keeps_trying_is_told_its_turn_that_far_off() {
        // 2 places a second, turns told 3 a second: 60 fit before the 30 s
        // cap, 870 before 300 s.
        let (queue, now) = measured(20, Duration::from_secs(10));
        let _waiting: Vec<_> = (0..100).map(|_| queue.enter()).collect();
        let patient = Some(Duration::from_secs(600));
        let turns = told(&queue, now, &many(900, patient));
        let ordered = turns.windows(2).take_while(|w| w[0] < w[1]).count();
        assert_eq!(ordered + 1, 870, "a third of a second apart up to 300 s");
        assert!(turns.iter().all(|t| *t <= MAX_PATIENT_RETRY_AFTER));
        // An agent that does not say, arriving after them, is told at most
        // the 30 s it would wait anyway; its turn is past that now.
        let [late] = told(&queue, now, &[caller(900, None)])[..] else {
            unreachable!("one caller, one answer")
        };
        assert!((WAIT..=MAX_RETRY_AFTER).contains(&late), "{late:?}");
    }

    #[test]
    fn patience_is_kept_off_by_a_margin_and_bounded_both_ways() {
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(Queue::longest_wait(None), MAX_RETRY_AFTER);
        // Too little to wait longer than its backoff would: as before.
        assert_eq!(Queue::longest_wait(secs(0)), MAX_RETRY_AFTER);
        assert_eq!(Queue::longest_wait(secs(80)), MAX_RETRY_AFTER);
        assert_eq!(Queue::longest_wait(secs(200)), Duration::from_secs(140));
        assert_eq!(Queue::longest_wait(secs(600)), MAX_PATIENT_RETRY_AFTER);
        assert_eq!(Queue::longest_wait(secs(u64::MAX)), MAX_PATIENT_RETRY_AFTER);
    }

    #[test]
    fn an_instance_asking_again_is_told_the_same_turn_and_holds_back_no_other() {
        // 20 places a second, past what the wait can serve.
        let (queue, now) = measured(200, Duration::from_secs(10));
        let _waiting: Vec<_> = (0..210).map(|_| queue.enter()).collect();
        let patient = Some(Duration::from_secs(600));
        let ms = |d: Duration| (d.as_secs_f64() * 1000.0).round() as u64;
        // One document sent a thousand times holds one turn.
        let again = vec![caller(7, patient); 1000];
        let turns: Vec<_> = told(&queue, now, &again).into_iter().map(ms).collect();
        assert!(turns.iter().all(|t| *t == 10_033), "{:?}", &turns[..3]);
        // The next instance's turn is one turn after it, not a thousand.
        assert_eq!(ms(told(&queue, now, &[caller(8, patient)])[0]), 10_067);
        // Once its turn has come, an instance asking again gets a new one.
        let later = now + Duration::from_secs(11);
        let next = ms(told(&queue, later, &[caller(7, patient)])[0]);
        assert!(next > 9_000, "a new turn after the queue ahead: {next}");
        assert_eq!(queue.state().turns.len(), 1, "the turns come forgotten");
    }

    #[test]
    fn turns_remembered_are_bounded() {
        // 50 places a second, turns told 75 a second: 21,750 would fit
        // before the 300 s cap, more than are remembered.
        let (queue, now) = measured(250, Duration::from_secs(5));
        let _waiting: Vec<_> = (0..600).map(|_| queue.enter()).collect();
        let patient = Some(Duration::from_secs(600));
        let turns = told(&queue, now, &many(MAX_TURNS + 100, patient));
        let state = queue.state();
        assert_eq!(state.turns.len(), MAX_TURNS);
        assert_eq!(state.told.len(), MAX_TURNS);
        drop(state);
        // Past it, a moment at random within the cap, no turn kept.
        assert!(turns[MAX_TURNS..]
            .iter()
            .all(|t| *t <= MAX_PATIENT_RETRY_AFTER));
    }
}
