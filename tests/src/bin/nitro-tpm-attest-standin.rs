//! Stands in for AWS's `nitro-tpm-attest` on a simulated instance: a real
//! NitroTPM only exists on EC2. Same arguments (`--nonce FILE`,
//! `--user-data FILE`, `--public-key FILE`, all optional), the raw
//! attestation document on stdout; its instance and PKI come from the
//! directory in `AUTONODE_TEST_NITRO_PKI`, and without it the machine has no
//! NitroTPM (message on stderr, exit 1). See
//! `autonode_tests::cloud::fakecloud::nitro`.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use autonode_tests::cloud::fakecloud::nitro::{standin, PKI_DIR_ENV};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = std::env::var_os(PKI_DIR_ENV).map(PathBuf::from);
    let written = standin(&args, dir.as_deref())
        .and_then(|doc| Ok(std::io::stdout().lock().write_all(&doc)?));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nitro-tpm-attest: {e:#}");
            ExitCode::FAILURE
        }
    }
}
