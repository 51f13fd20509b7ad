//! Benchmark (not a test): full identity verifications per second on one
//! core, on AWS's real us-west-2 sample exactly as IMDS serves it (base64
//! → BER → shape checks → digest → RSA-2048 verify → document parse).
//!
//! Run through `tests/bench/identity`, which also measures
//! `openssl speed rsa2048` in the same run and prints the ratio. Output:
//! one `key=value` per line; `iid_verify_per_s` is the median of the rounds.
//!
//! Env: `IID_BENCH_ROUNDS` (default 7), `IID_BENCH_ROUND_MS` (default 1000).

use autonode_shared::identity::{verify, ParsedSignature, TrustStore};
use std::hint::black_box;
use std::time::Duration;

mod common;
use common::{env_or, median, rate};

const SAMPLE: &str = include_str!("../data/aws-iid/samples/real-us-west-2-2021/rsa2048.b64");

fn main() {
    let rounds = env_or("IID_BENCH_ROUNDS", 7).max(1);
    let round = Duration::from_millis(env_or("IID_BENCH_ROUND_MS", 1000));
    let trust = TrustStore::aws();
    // Also the warm-up: the pinned certificates are parsed here, once.
    verify(SAMPLE.as_bytes(), &trust).expect("the real sample verifies");

    let full: Vec<f64> = (0..rounds)
        .map(|_| {
            rate(round, || {
                black_box(verify(black_box(SAMPLE.as_bytes()), &trust).is_ok());
            })
        })
        .collect();
    let parse_only = rate(round, || {
        black_box(ParsedSignature::from_text(black_box(SAMPLE.as_bytes())).is_ok());
    });
    println!("rounds={rounds}");
    println!("round_ms={}", round.as_millis());
    println!("iid_parse_per_s={parse_only:.0}");
    println!(
        "iid_verify_per_s_min={:.0}",
        full.iter().copied().fold(f64::INFINITY, f64::min)
    );
    println!(
        "iid_verify_per_s_max={:.0}",
        full.iter().copied().fold(0.0, f64::max)
    );
    println!("iid_verify_per_s={:.0}", median(full));
}
