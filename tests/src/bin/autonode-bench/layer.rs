//! An operator's base Ignition layer of a chosen size, for measuring what
//! rendering costs a join when there is one (`--ignition-kib`): files of
//! text in base64 data URLs with sha512 verification, each of which the
//! server decodes and hashes when it checks the layer, and a unit.

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha512};

/// The ConfigMap the bench puts the layer in (`--base-ignition`).
pub(crate) const CONFIGMAP: &str = "bench-base";
/// Each file's size: a script or a drop-in, not one large blob.
const FILE_BYTES: usize = 8 * 1024;

/// A base layer of about `kib` KiB of file contents (before base64).
pub(crate) fn base_layer(kib: usize) -> String {
    let files: Vec<Value> = (0..kib.div_ceil(FILE_BYTES / 1024))
        .map(|i| {
            let data = text(i as u64, FILE_BYTES);
            let hash = hex(&Sha512::digest(&data));
            json!({
                "path": format!("/opt/bench/file-{i}.sh"),
                "mode": 0o755,
                "contents": {
                    "source": format!("data:;base64,{}",
                        base64::engine::general_purpose::STANDARD.encode(&data)),
                    "verification": {"hash": format!("sha512-{hash}")},
                },
            })
        })
        .collect();
    json!({
        "ignition": {"version": "3.2.0"},
        "storage": {"files": files},
        "systemd": {"units": [{"name": "bench.service", "enabled": false,
            "contents": "[Service]\nExecStart=/bin/true\n"}]},
    })
    .to_string()
}

/// `len` bytes of lowercase text, different for each `seed` (a linear
/// congruential sequence: varied enough that nothing is shared between
/// files, and the same in every run).
fn text(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            if i % 64 == 63 {
                return b'\n';
            }
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            b'a' + ((state >> 33) % 26) as u8
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_is_one_the_agent_accepts_of_the_size_asked() {
        let text = base_layer(64);
        let value: Value = serde_json::from_str(&text).unwrap();
        let config = autonode_shared::ignition::parse(&value).unwrap();
        assert_eq!(config.storage.files.len(), 8);
        assert!(text.len() > 64 * 1024 * 4 / 3, "{}", text.len());
    }
}
