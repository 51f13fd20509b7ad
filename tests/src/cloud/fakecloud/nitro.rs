//! A test Nitro PKI, and the NitroTPM of a simulated instance.
//!
//! AWS's NitroTPM attestation documents are signed by a leaf that only
//! AWS's Nitro hardware holds, so tests play AWS with their own PKI of the
//! same shape, and the server under test pins its root in place of AWS's:
//!
//! - the chain is AWS's: root → regional CA (pathLen 2, 20 days) → zonal
//!   CA (pathLen 1, 5 days) → instance CA `i-<id>.<region>.aws.nitro-enclaves`
//!   (pathLen 0, 1 day) → leaf `<module_id>.<region>.aws` (3 hours), every
//!   key P-384 and every signature ecdsa-with-SHA384; the root's subject is
//!   AWS's own (`CN=aws.nitro-enclaves, OU=AWS, O=Amazon, C=US`), so a
//!   verifier that trusted a document's own root by name would accept it;
//! - the document is AWS's: an untagged COSE_Sign1 with protected header
//!   `{1: -35}` and an empty unprotected map, its payload an
//!   indefinite-length map with AWS's keys in AWS's order (`timestamp` as
//!   an 8-byte integer, all 24 `nitrotpm_pcrs`, the optional fields null
//!   when not given).
//!
//! [`TestNitroPki::generate`] makes a fresh root each time: "another
//! server's PKI" is another `generate()`.
//!
//! # The `nitro-tpm-attest` stand-in
//!
//! On an instance, the agent runs AWS's `nitro-tpm-attest` (package
//! `aws-nitro-tpm-tools`), which asks the instance's NitroTPM for a
//! document. A NitroTPM only exists on EC2, so the simulated instance runs
//! `nitro-tpm-attest-standin` (a binary of this crate) instead: the same
//! command line (`--nonce`, `--user-data`, `--public-key`, each an
//! optional file), the raw document on stdout. It reads its instance from
//! the directory in `AUTONODE_TEST_NITRO_PKI`, written by
//! [`TestNitroPki::write_to`]; without that variable it behaves like a
//! machine without a NitroTPM (a message on stderr, exit 1).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use autonode_shared::nitro::cbor::encode_head;
use autonode_shared::nitro::cose::{sig_structure, PROTECTED_ES384};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P384_SHA384,
};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P384_SHA384_FIXED_SIGNING};
use time::{Duration, OffsetDateTime};

/// The env var naming the directory [`TestNitroPki::write_to`] wrote, read
/// by the `nitro-tpm-attest-standin` binary.
pub const PKI_DIR_ENV: &str = "AUTONODE_TEST_NITRO_PKI";
/// The region in the chain's names.
pub const TEST_NITRO_REGION: &str = "us-west-2";
/// A NitroTPM register: SHA-384.
pub type Pcr = [u8; 48];

/// A CA of the test PKI, with its key.
type Ca = CertifiedIssuer<'static, KeyPair>;

/// A Nitro attestation PKI shaped like AWS's, down to the zonal CA; each
/// instance gets its instance CA and leaf from [`TestNitroPki::tpm`].
pub struct TestNitroPki {
    root: Ca,
    zonal: Ca,
    /// DER, root first: the cabundle down to the zonal CA.
    upper: Vec<Vec<u8>>,
}

impl std::fmt::Debug for TestNitroPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the keys.
        f.debug_struct("TestNitroPki").finish_non_exhaustive()
    }
}

impl TestNitroPki {
    /// A fresh root, regional and zonal CA.
    pub fn generate() -> Result<Self> {
        let root = ca(root_name(), None, Duration::days(365 * 30), None)?;
        let region = TEST_NITRO_REGION;
        let regional_cn = format!("{}.{region}.aws.nitro-enclaves", random_hex());
        let regional = ca(
            aws_name(&regional_cn, false),
            Some(2),
            Duration::days(20),
            Some(&root),
        )?;
        let zonal_cn = format!("{}.zonal.{region}.aws.nitro-enclaves", random_hex());
        let zonal = ca(
            aws_name(&zonal_cn, true),
            Some(1),
            Duration::days(5),
            Some(&regional),
        )?;
        let upper = [&root, &regional, &zonal]
            .iter()
            .map(|c| c.der().to_vec())
            .collect();
        Ok(Self { root, zonal, upper })
    }

    /// The root, PEM: what a server under test pins.
    pub fn root_pem(&self) -> String {
        self.root.pem()
    }

    /// The NitroTPM of instance `instance_id` (`i-…`): a new instance CA
    /// and a 3-hour leaf, with `pcrs` (missing registers read zero).
    pub fn tpm(&self, instance_id: &str, pcrs: &BTreeMap<u8, Pcr>) -> Result<TestNitroTpm> {
        let region = TEST_NITRO_REGION;
        let instance_cn = format!("{instance_id}.{region}.aws.nitro-enclaves");
        let instance = ca(
            aws_name(&instance_cn, true),
            Some(0),
            Duration::days(1),
            Some(&self.zonal),
        )?;
        let module_id = format!("{instance_id}-tpm0000000000000000");
        let key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = aws_name(&format!("{module_id}.{region}.aws"), true);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::ContentCommitment,
        ];
        valid_for(&mut params, Duration::hours(3));
        let leaf = params.signed_by(&key, &instance)?;
        let mut cabundle = self.upper.clone();
        cabundle.push(instance.der().to_vec());
        let registers = (0..24u8)
            .map(|i| (i, pcrs.get(&i).copied().unwrap_or([0; 48])))
            .collect();
        TestNitroTpm::new(
            module_id,
            cabundle,
            leaf.der().to_vec(),
            key.serialize_der(),
            registers,
        )
    }

    /// A NitroTPM document of instance `instance_id` (module_id
    /// `<id>-tpm0000000000000000`), `nitrotpm_pcrs` 0..=23 from `pcrs`
    /// (missing ones zero), with `nonce` and `user_data`, signed now.
    pub fn document(
        &self,
        instance_id: &str,
        pcrs: &BTreeMap<u8, Pcr>,
        nonce: Option<&[u8]>,
        user_data: Option<&[u8]>,
    ) -> Result<Vec<u8>> {
        self.tpm(instance_id, pcrs)?.attest(nonce, user_data, None)
    }

    /// Writes instance `instance_id`'s NitroTPM to `dir` (created if
    /// needed) for the `nitro-tpm-attest-standin` binary: point
    /// [`PKI_DIR_ENV`] at `dir`.
    pub fn write_to(&self, dir: &Path, instance_id: &str, pcrs: &BTreeMap<u8, Pcr>) -> Result<()> {
        self.tpm(instance_id, pcrs)?.write_to(dir)
    }
}

/// One instance's NitroTPM: its module id, chain, leaf key and registers.
pub struct TestNitroTpm {
    module_id: String,
    /// DER, root first, down to the instance CA.
    cabundle: Vec<Vec<u8>>,
    leaf_der: Vec<u8>,
    leaf_pkcs8: Vec<u8>,
    leaf_key: EcdsaKeyPair,
    pcrs: BTreeMap<u8, Pcr>,
}

impl std::fmt::Debug for TestNitroTpm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNitroTpm")
            .field("module_id", &self.module_id)
            .finish_non_exhaustive()
    }
}

// The files of a NitroTPM written for the stand-in.
const MODULE_ID_FILE: &str = "module_id";
const CABUNDLE_FILE: &str = "cabundle.der";
const LEAF_FILE: &str = "leaf.der";
const LEAF_KEY_FILE: &str = "leaf.pkcs8";
const PCRS_FILE: &str = "pcrs";

impl TestNitroTpm {
    fn new(
        module_id: String,
        cabundle: Vec<Vec<u8>>,
        leaf_der: Vec<u8>,
        leaf_pkcs8: Vec<u8>,
        pcrs: BTreeMap<u8, Pcr>,
    ) -> Result<Self> {
        let leaf_key = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P384_SHA384_FIXED_SIGNING,
            &leaf_pkcs8,
            &SystemRandom::new(),
        )
        .map_err(|e| anyhow::anyhow!("the leaf key is not a P-384 PKCS#8 key: {e}"))?;
        Ok(Self {
            module_id,
            cabundle,
            leaf_der,
            leaf_pkcs8,
            leaf_key,
            pcrs,
        })
    }

    /// The document's `module_id`.
    pub fn module_id(&self) -> &str {
        &self.module_id
    }

    /// A document signed now, carrying the caller's values (null when not
    /// given), as `nitro-tpm-attest` returns it.
    pub fn attest(
        &self,
        nonce: Option<&[u8]>,
        user_data: Option<&[u8]>,
        public_key: Option<&[u8]>,
    ) -> Result<Vec<u8>> {
        let payload = self.payload(nonce, user_data, public_key)?;
        let signed = sig_structure(&PROTECTED_ES384, &payload);
        let signature = self
            .leaf_key
            .sign(&SystemRandom::new(), &signed)
            .map_err(|e| anyhow::anyhow!("signing the document: {e}"))?;
        let mut out = vec![0x84];
        bytes(&mut out, &PROTECTED_ES384);
        out.push(0xa0);
        bytes(&mut out, &payload);
        bytes(&mut out, signature.as_ref());
        Ok(out)
    }

    /// The payload map, indefinite-length, keys in AWS's order.
    fn payload(
        &self,
        nonce: Option<&[u8]>,
        user_data: Option<&[u8]>,
        public_key: Option<&[u8]>,
    ) -> Result<Vec<u8>> {
        let millis = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .context("the clock is before 1970")?
            .as_millis();
        let millis = u64::try_from(millis).context("the clock is past 2^64 ms")?;
        let mut out = vec![0xbf];
        text(&mut out, "module_id");
        text(&mut out, &self.module_id);
        text(&mut out, "digest");
        text(&mut out, "SHA384");
        text(&mut out, "timestamp");
        // AWS always writes the timestamp as an 8-byte integer.
        out.push(0x1b);
        out.extend_from_slice(&millis.to_be_bytes());
        text(&mut out, "nitrotpm_pcrs");
        encode_head(&mut out, 5, self.pcrs.len() as u64);
        for (index, pcr) in &self.pcrs {
            encode_head(&mut out, 0, u64::from(*index));
            bytes(&mut out, pcr);
        }
        text(&mut out, "certificate");
        bytes(&mut out, &self.leaf_der);
        text(&mut out, "cabundle");
        encode_head(&mut out, 4, self.cabundle.len() as u64);
        for cert in &self.cabundle {
            bytes(&mut out, cert);
        }
        for (key, value) in [
            ("public_key", public_key),
            ("user_data", user_data),
            ("nonce", nonce),
        ] {
            text(&mut out, key);
            match value {
                Some(value) => bytes(&mut out, value),
                None => out.push(0xf6),
            }
        }
        out.push(0xff);
        Ok(out)
    }

    /// Writes this NitroTPM (chain, leaf key, module id, registers) to `dir`.
    pub fn write_to(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut cabundle = Vec::new();
        for cert in &self.cabundle {
            cabundle.extend_from_slice(&(cert.len() as u32).to_be_bytes());
            cabundle.extend_from_slice(cert);
        }
        let pcrs: Vec<u8> = self
            .pcrs
            .iter()
            .flat_map(|(i, pcr)| std::iter::once(*i).chain(*pcr))
            .collect();
        for (name, contents) in [
            (MODULE_ID_FILE, self.module_id.as_bytes()),
            (CABUNDLE_FILE, &cabundle[..]),
            (LEAF_FILE, &self.leaf_der[..]),
            (LEAF_KEY_FILE, &self.leaf_pkcs8[..]),
            (PCRS_FILE, &pcrs[..]),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, contents)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }

    /// Reads what [`TestNitroTpm::write_to`] wrote.
    pub fn read_from(dir: &Path) -> Result<Self> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
        };
        let module_id =
            String::from_utf8(read(MODULE_ID_FILE)?).context("module_id is not UTF-8")?;
        let mut cabundle = Vec::new();
        let mut rest = &read(CABUNDLE_FILE)?[..];
        while let Some((len, tail)) = rest.split_first_chunk::<4>() {
            let len = u32::from_be_bytes(*len) as usize;
            if tail.len() < len {
                bail!("{CABUNDLE_FILE} is truncated");
            }
            cabundle.push(tail[..len].to_vec());
            rest = &tail[len..];
        }
        if !rest.is_empty() {
            bail!("{CABUNDLE_FILE} has trailing bytes");
        }
        let pcrs = parse_pcrs(&read(PCRS_FILE)?)?;
        Self::new(
            module_id,
            cabundle,
            read(LEAF_FILE)?,
            read(LEAF_KEY_FILE)?,
            pcrs,
        )
    }
}

/// The registers as the stand-in reads them: per register, its index byte
/// then its 48 bytes.
fn parse_pcrs(raw: &[u8]) -> Result<BTreeMap<u8, Pcr>> {
    let mut pcrs = BTreeMap::new();
    for entry in raw.chunks(49) {
        let (index, value) = entry.split_first().context("an empty PCR entry")?;
        let pcr: Pcr = value
            .try_into()
            .ok()
            .context("a PCR entry is not 1 + 48 bytes")?;
        pcrs.insert(*index, pcr);
    }
    Ok(pcrs)
}

fn text(out: &mut Vec<u8>, value: &str) {
    encode_head(out, 3, value.len() as u64);
    out.extend_from_slice(value.as_bytes());
}

fn bytes(out: &mut Vec<u8>, value: &[u8]) {
    encode_head(out, 2, value.len() as u64);
    out.extend_from_slice(value);
}

/// 16 random hex digits, as in AWS's CA names.
fn random_hex() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// AWS's root subject, exactly.
fn root_name() -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CountryName, "US");
    name.push(DnType::OrganizationName, "Amazon");
    name.push(DnType::OrganizationalUnitName, "AWS");
    name.push(DnType::CommonName, "aws.nitro-enclaves");
    name
}

/// The subject shape of AWS's lower certificates (with a locality below
/// the regional CA).
fn aws_name(common_name: &str, located: bool) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CountryName, "US");
    if located {
        name.push(DnType::StateOrProvinceName, "Washington");
        name.push(DnType::LocalityName, "Seattle");
    }
    name.push(DnType::OrganizationName, "Amazon");
    name.push(DnType::OrganizationalUnitName, "AWS");
    name.push(DnType::CommonName, common_name);
    name
}

/// A P-384 CA valid for `lifetime` from a minute ago, with `path_len`
/// (`None` = unconstrained), signed by `parent` (self-signed when `None`).
fn ca(
    name: DistinguishedName,
    path_len: Option<u8>,
    lifetime: Duration,
    parent: Option<&Ca>,
) -> Result<Ca> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(match path_len {
        Some(len) => BasicConstraints::Constrained(len),
        None => BasicConstraints::Unconstrained,
    });
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    valid_for(&mut params, lifetime);
    Ok(match parent {
        Some(parent) => CertifiedIssuer::signed_by(params, key, parent)?,
        None => CertifiedIssuer::self_signed(params, key)?,
    })
}

/// Valid from a minute ago (the document's timestamp, taken after, must be
/// inside even on a coarse clock) for `lifetime`.
fn valid_for(params: &mut CertificateParams, lifetime: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(1);
    params.not_after = now + lifetime;
}

/// The `nitro-tpm-attest-standin` binary's work, given its arguments
/// (without the program name) and the directory [`PKI_DIR_ENV`] names: the
/// document on success, or the message for stderr.
pub fn standin(args: &[String], pki_dir: Option<&Path>) -> Result<Vec<u8>> {
    let (mut nonce, mut user_data, mut public_key) = (None, None, None);
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let slot = match flag.as_str() {
            "--nonce" => &mut nonce,
            "--user-data" => &mut user_data,
            "--public-key" => &mut public_key,
            other => bail!("unexpected argument {other:?}; usage: nitro-tpm-attest [--nonce FILE] [--user-data FILE] [--public-key FILE]"),
        };
        let path = args
            .next()
            .with_context(|| format!("{flag} needs a file"))?;
        *slot = Some(std::fs::read(path).with_context(|| format!("reading {path}"))?);
    }
    let Some(dir) = pki_dir else {
        bail!("no TPM device: this machine has no NitroTPM (the test stand-in reads its instance from {PKI_DIR_ENV})");
    };
    TestNitroTpm::read_from(dir)?.attest(
        nonce.as_deref(),
        user_data.as_deref(),
        public_key.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use autonode_shared::nitro::{verify, At, Failure, Kind, Root};

    fn pcrs() -> BTreeMap<u8, Pcr> {
        BTreeMap::from([(0, [0x6e; 48]), (4, [0x04; 48]), (17, [0xff; 48])])
    }

    #[test]
    fn its_documents_verify_with_its_root_and_not_with_aws() {
        let pki = TestNitroPki::generate().unwrap();
        let doc = pki
            .document(
                "i-0123456789abcdef0",
                &pcrs(),
                Some(b"nonce"),
                Some(b"keys"),
            )
            .unwrap();
        let root = Root::from_pem(pki.root_pem().as_bytes()).unwrap();
        let verified = verify(&doc, &root, At::Instant(SystemTime::now())).unwrap();
        assert_eq!(
            verified.module_id,
            "i-0123456789abcdef0-tpm0000000000000000"
        );
        assert_eq!(verified.instance_id(), Some("i-0123456789abcdef0"));
        assert_eq!(verified.kind, Kind::NitroTpm);
        assert_eq!(verified.pcrs.len(), 24);
        assert_eq!(verified.pcrs[&4], [0x04; 48]);
        assert_eq!(verified.pcrs[&5], [0; 48]);
        assert_eq!(verified.nonce.as_deref(), Some(&b"nonce"[..]));
        assert_eq!(verified.user_data.as_deref(), Some(&b"keys"[..]));
        assert_eq!(verified.public_key, None);
        // The forged chain: AWS's root name, another key.
        let err = verify(&doc, &Root::aws(), At::DocumentTime).unwrap_err();
        assert_eq!(err.kind(), Failure::Untrusted);
        // Another generate() is another server's PKI.
        let other = TestNitroPki::generate().unwrap();
        let other_root = Root::from_pem(other.root_pem().as_bytes()).unwrap();
        let err = verify(&doc, &other_root, At::DocumentTime).unwrap_err();
        assert_eq!(err.kind(), Failure::Untrusted);
        // The leaf lives three hours.
        let later = SystemTime::now() + std::time::Duration::from_secs(3 * 3600 + 120);
        let err = verify(&doc, &root, At::Instant(later)).unwrap_err();
        assert_eq!(err.kind(), Failure::Expired);
    }

    #[test]
    fn its_documents_are_shaped_like_aws() {
        let pki = TestNitroPki::generate().unwrap();
        let doc = pki
            .document("i-0123456789abcdef0", &pcrs(), None, None)
            .unwrap();
        // Untagged COSE_Sign1, {1: -35}, empty unprotected map, then an
        // indefinite-length payload map.
        assert_eq!(doc[..6], [0x84, 0x44, 0xa1, 0x01, 0x38, 0x22]);
        assert_eq!(doc[6], 0xa0);
        let payload_start = if doc[7] == 0x59 { 10 } else { 9 };
        assert_eq!(doc[payload_start], 0xbf);
        let root = Root::from_pem(pki.root_pem().as_bytes()).unwrap();
        let verified = verify(&doc, &root, At::DocumentTime).unwrap();
        assert_eq!((verified.nonce, verified.user_data), (None, None));
    }

    #[test]
    fn the_standin_reads_what_write_to_wrote() {
        let pki = TestNitroPki::generate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        pki.write_to(dir.path(), "i-0fedcba9876543210", &pcrs())
            .unwrap();
        let tpm = TestNitroTpm::read_from(dir.path()).unwrap();
        let doc = tpm.attest(Some(b"n"), None, Some(b"pk")).unwrap();
        let root = Root::from_pem(pki.root_pem().as_bytes()).unwrap();
        let verified = verify(&doc, &root, At::DocumentTime).unwrap();
        assert_eq!(verified.instance_id(), Some("i-0fedcba9876543210"));
        assert_eq!(verified.pcrs[&17], [0xff; 48]);
        assert_eq!(verified.public_key.as_deref(), Some(&b"pk"[..]));
    }

    #[test]
    fn the_standin_takes_the_real_tools_arguments_and_has_no_tpm_without_a_pki() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let dir = tempfile::tempdir().unwrap();
        let pki = TestNitroPki::generate().unwrap();
        pki.write_to(dir.path(), "i-0fedcba9876543210", &pcrs())
            .unwrap();
        let nonce = dir.path().join("nonce-file");
        std::fs::write(&nonce, b"0123").unwrap();
        let nonce = nonce.to_str().unwrap();
        let some = Some(dir.path());
        let doc = standin(&args(&["--nonce", nonce]), some).unwrap();
        let root = Root::from_pem(pki.root_pem().as_bytes()).unwrap();
        let verified = verify(&doc, &root, At::DocumentTime).unwrap();
        assert_eq!(verified.nonce.as_deref(), Some(&b"0123"[..]));
        assert!(standin(&args(&["--bogus"]), some).is_err());
        assert!(standin(&args(&["--nonce"]), some).is_err());
        assert!(standin(&args(&["--nonce", "/nonexistent/nonce"]), some).is_err());
        // No directory: a machine without a NitroTPM.
        let err = standin(&args(&["--nonce", nonce]), None).unwrap_err();
        assert!(err.to_string().starts_with("no TPM device"), "{err}");
    }
}
