//! Benchmark (not a test): the CPU of one attested join's verification,
//! [`autonode_shared::nitro::verify`] on the real AWS-signed documents in
//! `shared/src/nitro/testdata/`, each checked at its own timestamp (CBOR →
//! COSE → payload rules → 5-certificate chain, 5 ECDSA P-384 verifications →
//! COSE signature, the 6th).
//!
//! `cargo run --release -p autonode-shared --example nitro_bench`
//!
//! Output: one `key=value` per line, per document kind: the median
//! verifications per second on one core over the rounds, the slowest and
//! fastest round, and the median's microseconds per verification; then one
//! ECDSA P-384 signature check alone (`p384_verify_per_s`, a document needs
//! five) and `Root::aws()` (PEM parse and the root's self-signature).
//!
//! Env: `NITRO_BENCH_ROUNDS` (default 7), `NITRO_BENCH_ROUND_MS` (default 1000).

use autonode_shared::nitro::chain::Chain;
use autonode_shared::nitro::cose::Sign1;
use autonode_shared::nitro::document::Payload;
use autonode_shared::nitro::{verify_with, At, Memo, Root};
use std::hint::black_box;
use std::time::Duration;

mod common;
use common::{env_or, median, rate};

const NITROTPM: &[&[u8]] = &[
    include_bytes!("../src/nitro/testdata/nitrotpm-biomodel-2026-08-13.cbor"),
    include_bytes!("../src/nitro/testdata/nitrotpm-vaportpm-2026-02-03.cbor"),
];
/// The largest real document (1024 bytes each of nonce, user data, key).
const ENCLAVE_LARGEST: &[&[u8]] = &[include_bytes!(
    "../src/nitro/testdata/enclave-blocky-2024-09-07.cbor"
)];

fn report(name: &str, docs: &[&[u8]], root: &Root, memo: &Memo, rounds: u64, round: Duration) {
    for doc in docs {
        verify_with(doc, root, At::DocumentTime, memo).expect("the real document verifies");
    }
    let rates: Vec<f64> = (0..rounds)
        .map(|_| {
            rate(round, || {
                for doc in docs {
                    black_box(verify_with(black_box(doc), root, At::DocumentTime, memo).is_ok());
                }
            }) * docs.len() as f64
        })
        .collect();
    let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let max = rates.iter().copied().fold(0.0, f64::max);
    let median = median(rates);
    println!("{name}_verify_per_s_min={min:.0}");
    println!("{name}_verify_per_s_max={max:.0}");
    println!("{name}_verify_per_s={median:.0}");
    println!("{name}_verify_us={:.0}", 1e6 / median);
}

fn main() {
    let rounds = env_or("NITRO_BENCH_ROUNDS", 7).max(1);
    let round = Duration::from_millis(env_or("NITRO_BENCH_ROUND_MS", 1000));
    let root = Root::aws();
    println!("rounds={rounds}");
    println!("round_ms={}", round.as_millis());
    let forget = Memo::new(0);
    report("nitrotpm", NITROTPM, &root, &forget, rounds, round);
    // As the server verifies a fleet's documents: the regional and zonal
    // CAs' signatures remembered, three P-384 checks a document.
    let memo = Memo::new(64);
    report("nitrotpm_remembered", NITROTPM, &root, &memo, rounds, round);
    report(
        "enclave_7kb",
        ENCLAVE_LARGEST,
        &root,
        &forget,
        rounds,
        round,
    );
    // One P-384 verification alone (the COSE signature's), to split the
    // cost: a document costs five (four chain links and the COSE one).
    let sign1 = Sign1::parse(NITROTPM[0]).expect("the real document parses");
    let payload = Payload::parse(&sign1.payload).expect("its payload parses");
    let chain = Chain::authenticate(root.der(), &payload.cabundle, &payload.certificate, &forget)
        .expect("its chain is AWS's");
    let p384: Vec<f64> = (0..rounds)
        .map(|_| {
            rate(round, || {
                black_box(sign1.verify(chain.leaf_point())).unwrap_or(())
            })
        })
        .collect();
    println!("p384_verify_per_s={:.0}", median(p384));
    let parse_root = rate(round, || {
        black_box(Root::aws());
    });
    println!("root_parse_per_s={parse_root:.0}");
}
