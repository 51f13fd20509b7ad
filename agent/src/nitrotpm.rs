//! The machine's attestation evidence: a NitroTPM attestation document
//! from AWS's `nitro-tpm-attest` tool (Amazon Linux's
//! `aws-nitro-tpm-tools`), with the server's challenge as its `nonce` and
//! the digest of the kubelet's two keys as its `user_data`
//! ([`autonode_shared::protocol::attested_keys_digest`]).
//!
//! The tool, not the TPM device, is what the agent talks to: it is how AWS
//! documents getting the document, and it keeps the agent free of the
//! TPM's command set. Where there is no tool, or it fails (an instance
//! type or AMI without NitroTPM), the agent says so plainly and joins
//! with [`Attestation::Unavailable`]: a class that must attest refuses it
//! with a reason naming the policy, and any other class does not care.

use autonode_shared::protocol::Attestation;
use base64::Engine;
use std::path::PathBuf;
use std::time::Duration;

/// Where Amazon Linux installs the tool.
pub const DEFAULT_TOOL: &str = "/usr/bin/nitro-tpm-attest";
/// Names another tool (the tests' stand-in, or a copy elsewhere).
pub const TOOL_ENV: &str = "AUTONODE_NITRO_TPM_ATTEST";
/// A document takes the TPM well under a second; past this the tool is
/// stuck and the join goes on without it.
const TOOL_TIMEOUT: Duration = Duration::from_secs(20);
/// The most a document may be (the server's bound too).
const MAX_DOCUMENT: usize = autonode_shared::nitro::MAX_DOCUMENT_BYTES;

/// The instance's NitroTPM, through AWS's tool.
#[derive(Debug)]
pub struct NitroTpm {
    tool: PathBuf,
    /// Whether "no attestation, and why" was logged: once a run, not once
    /// per retry.
    told: std::sync::atomic::AtomicBool,
}

impl NitroTpm {
    /// The tool named by [`TOOL_ENV`], else [`DEFAULT_TOOL`].
    pub fn from_env() -> Self {
        let tool = std::env::var_os(TOOL_ENV).map_or_else(|| DEFAULT_TOOL.into(), PathBuf::from);
        Self::at(tool)
    }

    /// The tool at `tool`.
    pub fn at(tool: PathBuf) -> Self {
        Self {
            tool,
            told: Default::default(),
        }
    }

    /// The evidence for a join: a document for `nonce` (base64, as the
    /// server's challenge gave it) and `keys_digest`, or why there is none.
    pub async fn evidence(&self, nonce: &str, keys_digest: &[u8; 32]) -> Attestation {
        match self.document(nonce, keys_digest).await {
            Ok(document) => Attestation::NitroTpm {
                nonce: nonce.to_string(),
                document: base64::engine::general_purpose::STANDARD.encode(document),
            },
            Err(reason) => {
                if !self.told.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    log::warn!("joining without NitroTPM attestation: {reason}; an EC2NodeClass that requires attestation refuses this machine");
                }
                Attestation::Unavailable { reason }
            }
        }
    }

    async fn document(&self, nonce: &str, keys_digest: &[u8; 32]) -> Result<Vec<u8>, String> {
        if !self.tool.exists() {
            return Err(format!(
                "no {} on this AMI (install aws-nitro-tpm-tools in an AMI with NitroTPM)",
                self.tool.display()
            ));
        }
        let nonce = base64::engine::general_purpose::STANDARD
            .decode(nonce)
            .map_err(|e| format!("the server's nonce is not base64: {e}"))?;
        let dir = Scratch::new().map_err(|e| format!("making a private directory: {e}"))?;
        let nonce_file = dir.write("nonce", &nonce)?;
        let user_data_file = dir.write("user-data", keys_digest)?;
        let run = tokio::process::Command::new(&self.tool)
            .arg("--nonce")
            .arg(&nonce_file)
            .arg("--user-data")
            .arg(&user_data_file)
            .kill_on_drop(true)
            .output();
        let output = match tokio::time::timeout(TOOL_TIMEOUT, run).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err(format!("running {}: {e}", self.tool.display())),
            Err(_) => {
                return Err(format!(
                    "{} did not answer in {TOOL_TIMEOUT:?}",
                    self.tool.display()
                ))
            }
        };
        if !output.status.success() {
            let said = String::from_utf8_lossy(&output.stderr);
            let said: String = said.trim().chars().take(300).collect();
            return Err(format!(
                "{} failed ({}): {said}",
                self.tool.display(),
                output.status
            ));
        }
        match output.stdout.len() {
            0 => Err(format!("{} printed no document", self.tool.display())),
            n if n > MAX_DOCUMENT => Err(format!(
                "{} printed {n} bytes, more than a document's {MAX_DOCUMENT}",
                self.tool.display()
            )),
            _ => Ok(output.stdout),
        }
    }
}

/// A directory only root reads, made fresh (never one that was there: a
/// name another user created first is refused), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let name = format!("autonode-attest-{}-{:016x}", std::process::id(), rand_u64());
        let path = std::env::temp_dir().join(name);
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self(path))
    }

    fn write(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, String> {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(path)
    }

    #[cfg(test)]
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A name no other process guesses: the time, hashed under the
/// process's random `RandomState` keys (no random crate needed).
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    fn tool(dir: &Path, name: &str, script: &str) -> NitroTpm {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        NitroTpm::at(path)
    }

    #[tokio::test]
    async fn the_tool_gets_the_nonce_and_the_keys_digest_as_files_and_its_output_is_the_document() {
        let dir = tempfile::tempdir().unwrap();
        // The stand-in prints the two files it was given, nonce first.
        let tpm = tool(dir.path(), "echoing", r#"cat "$2" "$4""#);
        let nonce = base64::engine::general_purpose::STANDARD.encode(b"the-nonce");
        let evidence = tpm.evidence(&nonce, &[7; 32]).await;
        let Attestation::NitroTpm {
            nonce: sent,
            document,
        } = evidence
        else {
            panic!("no document: {evidence:?}");
        };
        assert_eq!(sent, nonce);
        let document = base64::engine::general_purpose::STANDARD
            .decode(document)
            .unwrap();
        assert_eq!(document, [b"the-nonce".as_slice(), &[7; 32]].concat());
    }

    #[tokio::test]
    async fn no_tool_or_a_failing_one_is_said_plainly() {
        let dir = tempfile::tempdir().unwrap();
        let nonce = base64::engine::general_purpose::STANDARD.encode(b"n");
        let missing = NitroTpm::at(dir.path().join("none"));
        let failing = tool(dir.path(), "failing", "echo 'no TPM device' >&2; exit 1");
        let silent = tool(dir.path(), "silent", "true");
        for (tpm, words) in [
            (missing, "install aws-nitro-tpm-tools"),
            (failing, "no TPM device"),
            (silent, "printed no document"),
        ] {
            match tpm.evidence(&nonce, &[0; 32]).await {
                Attestation::Unavailable { reason } => assert!(reason.contains(words), "{reason}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_scratch_directory_is_private_and_removed() {
        let scratch = Scratch::new().unwrap();
        let path = scratch.path().to_path_buf();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        drop(scratch);
        assert!(!path.exists());
    }
}
