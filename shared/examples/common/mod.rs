//! What the benchmark examples share: reading their knobs and timing rounds.

use std::time::{Duration, Instant};

/// The number in env var `name`, or `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Operations per second of `op`, run for about `round` (time is read only
/// every 32 operations so the clock does not dominate).
pub fn rate(round: Duration, mut op: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    loop {
        for _ in 0..32 {
            op();
        }
        n += 32;
        let elapsed = start.elapsed();
        if elapsed >= round {
            return n as f64 / elapsed.as_secs_f64();
        }
    }
}

/// The middle value (the upper one of an even count).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}
