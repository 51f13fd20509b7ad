//! The payload of an attestation document: its fields and their rules.
//!
//! A CBOR map with text keys, no others than these:
//!
//! | key | rule |
//! | --- | --- |
//! | `module_id` | text, 1..=255 bytes |
//! | `digest` | the text `"SHA384"` |
//! | `timestamp` | unsigned, milliseconds since the Unix epoch, not 0 |
//! | `nitrotpm_pcrs` *or* `pcrs` | exactly one of them: a map of 1..=24 (NitroTPM, indices 0..=23) or 1..=32 (enclave, 0..=31) entries, each value 48 bytes |
//! | `certificate` | bytes, 1..=1024 |
//! | `cabundle` | array of 1..=[`MAX_CABUNDLE`] byte strings of 1..=1024 |
//! | `public_key` | optional; null or bytes 1..=1024 |
//! | `user_data`, `nonce` | optional; null or bytes 0..=1024 |
//!
//! The optional fields are null, not absent, in every real document, and
//! AWS's own examples carry 1024 bytes in each, so both are accepted.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::cbor::{self, Value};
use super::error::NitroError;

/// The longest `cabundle` accepted (AWS's has 4: root, regional, zonal,
/// instance CA); a bound on the chain work a document can ask for.
pub const MAX_CABUNDLE: usize = 8;
/// The longest certificate, `public_key`, `user_data` or `nonce`.
pub const MAX_FIELD_BYTES: usize = 1024;
const MAX_MODULE_ID_BYTES: usize = 255;
/// The suffix of every NitroTPM `module_id` after the instance id.
pub const NITROTPM_MODULE: &str = "tpm0000000000000000";
/// A PCR value: a SHA-384 digest.
pub const PCR_BYTES: usize = 48;

/// Which Nitro module signed the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// An EC2 instance's NitroTPM (`nitrotpm_pcrs`, 24 registers).
    NitroTpm,
    /// A Nitro Enclave (`pcrs`, up to 32 registers).
    Enclave,
}

impl Kind {
    fn pcr_key(self) -> &'static str {
        match self {
            Kind::NitroTpm => "nitrotpm_pcrs",
            Kind::Enclave => "pcrs",
        }
    }

    fn pcr_count(self) -> usize {
        match self {
            Kind::NitroTpm => 24,
            Kind::Enclave => 32,
        }
    }
}

/// What a verified document says. Only [`super::verify`] makes one, so
/// holding one means the checks in the module docs passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// The module that signed: `i-<instance>-tpm0000000000000000` for a
    /// NitroTPM, `i-<instance>-enc<enclave>` for an enclave.
    pub module_id: String,
    /// When the module signed (the payload's `timestamp`).
    pub timestamp: SystemTime,
    /// NitroTPM or enclave (which PCR map the payload had).
    pub kind: Kind,
    /// The PCRs, by index.
    pub pcrs: BTreeMap<u8, [u8; PCR_BYTES]>,
    /// The caller's nonce, if it gave one.
    pub nonce: Option<Vec<u8>>,
    /// The caller's user data, if it gave any.
    pub user_data: Option<Vec<u8>>,
    /// The caller's public key, if it gave one (opaque bytes: not always DER).
    pub public_key: Option<Vec<u8>>,
}

impl Document {
    /// The EC2 instance id in `module_id`: `i-0123…` from
    /// `i-0123…-tpm0000000000000000` or `i-0123…-enc…`; `None` when the
    /// module id has no such shape.
    pub fn instance_id(&self) -> Option<&str> {
        let (instance, module) = self.module_id.rsplit_once('-')?;
        let hex = instance.strip_prefix("i-")?;
        let hex_ok = !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit());
        let module_ok = module == NITROTPM_MODULE
            || module
                .strip_prefix("enc")
                .is_some_and(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()));
        (hex_ok && module_ok).then_some(instance)
    }

    /// The timestamp in milliseconds since the Unix epoch.
    pub fn timestamp_ms(&self) -> u64 {
        self.timestamp
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// The payload: the document and the certificates that sign it.
#[derive(Debug)]
pub struct Payload<'a> {
    /// The fields a caller reads.
    pub document: Document,
    /// The leaf certificate (DER).
    pub certificate: Cow<'a, [u8]>,
    /// Root first, then each CA down to the leaf's issuer (DER).
    pub cabundle: Vec<Cow<'a, [u8]>>,
}

const KEYS: [&str; 10] = [
    "module_id",
    "digest",
    "timestamp",
    "pcrs",
    "nitrotpm_pcrs",
    "certificate",
    "cabundle",
    "public_key",
    "user_data",
    "nonce",
];

impl<'a> Payload<'a> {
    /// Reads the payload's bytes (as signed) and applies the rules above.
    pub fn parse(bytes: &'a [u8]) -> Result<Payload<'a>, NitroError> {
        let value = cbor::decode(bytes).map_err(|source| NitroError::Cbor {
            what: "the payload",
            source,
        })?;
        let Value::Map(entries) = value else {
            return Err(NitroError::payload("not a map"));
        };
        let mut fields: BTreeMap<&'static str, Value<'a>> = BTreeMap::new();
        for (key, value) in entries {
            let known = key
                .as_text()
                .and_then(|k| KEYS.iter().find(|known| **known == k));
            match known {
                // The CBOR reader already refused repeated keys.
                Some(known) => fields.insert(known, value),
                None => return Err(NitroError::payload(format!("unexpected key {key:?}"))),
            };
        }
        Payload::from_fields(fields)
    }

    fn from_fields(
        mut fields: BTreeMap<&'static str, Value<'a>>,
    ) -> Result<Payload<'a>, NitroError> {
        let module_id = take_text(&mut fields, "module_id", MAX_MODULE_ID_BYTES)?;
        if take_text(&mut fields, "digest", 16)? != "SHA384" {
            return Err(NitroError::payload("digest is not \"SHA384\""));
        }
        let timestamp = timestamp(fields.remove("timestamp"))?;
        let kind = match (
            fields.contains_key("nitrotpm_pcrs"),
            fields.contains_key("pcrs"),
        ) {
            (true, false) => Kind::NitroTpm,
            (false, true) => Kind::Enclave,
            _ => {
                return Err(NitroError::payload(
                    "not exactly one of pcrs / nitrotpm_pcrs",
                ))
            }
        };
        let pcrs = pcrs(kind, fields.remove(kind.pcr_key()))?;
        let certificate = take_bytes(&mut fields, "certificate", 1)?
            .ok_or_else(|| NitroError::payload("certificate is missing"))?;
        let cabundle = cabundle(fields.remove("cabundle"))?;
        let document = Document {
            module_id: module_id.into_owned(),
            timestamp,
            kind,
            pcrs,
            public_key: take_bytes(&mut fields, "public_key", 1)?.map(Cow::into_owned),
            user_data: take_bytes(&mut fields, "user_data", 0)?.map(Cow::into_owned),
            nonce: take_bytes(&mut fields, "nonce", 0)?.map(Cow::into_owned),
        };
        Ok(Payload {
            document,
            certificate,
            cabundle,
        })
    }
}

fn take_text<'a>(
    fields: &mut BTreeMap<&'static str, Value<'a>>,
    key: &str,
    max: usize,
) -> Result<Cow<'a, str>, NitroError> {
    match fields.remove(key) {
        Some(Value::Text(t)) if (1..=max).contains(&t.len()) => Ok(t),
        Some(_) => Err(NitroError::payload(format!(
            "{key} is not text of 1..={max} bytes"
        ))),
        None => Err(NitroError::payload(format!("{key} is missing"))),
    }
}

/// An optional byte string (absent or null → `None`) of `min..=1024` bytes.
fn take_bytes<'a>(
    fields: &mut BTreeMap<&'static str, Value<'a>>,
    key: &str,
    min: usize,
) -> Result<Option<Cow<'a, [u8]>>, NitroError> {
    match fields.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bytes(b)) if (min..=MAX_FIELD_BYTES).contains(&b.len()) => Ok(Some(b)),
        Some(_) => Err(NitroError::payload(format!(
            "{key} is not null or bytes of {min}..={MAX_FIELD_BYTES}"
        ))),
    }
}

fn timestamp(value: Option<Value<'_>>) -> Result<SystemTime, NitroError> {
    match value {
        Some(Value::Uint(ms)) if ms > 0 => SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| NitroError::payload("timestamp is out of range")),
        Some(_) => Err(NitroError::payload("timestamp is not a positive integer")),
        None => Err(NitroError::payload("timestamp is missing")),
    }
}

fn pcrs(kind: Kind, value: Option<Value<'_>>) -> Result<BTreeMap<u8, [u8; PCR_BYTES]>, NitroError> {
    let key = kind.pcr_key();
    let entries = match value {
        Some(Value::Map(entries)) if (1..=kind.pcr_count()).contains(&entries.len()) => entries,
        _ => {
            return Err(NitroError::payload(format!(
                "{key} is not a map of 1..={} entries",
                kind.pcr_count()
            )))
        }
    };
    let mut out = BTreeMap::new();
    for (index, pcr) in entries {
        let index = match index {
            Value::Uint(i) if i < kind.pcr_count() as u64 => i as u8,
            _ => {
                return Err(NitroError::payload(format!(
                    "{key} has an index outside 0..{}",
                    kind.pcr_count()
                )))
            }
        };
        let pcr = pcr
            .as_bytes()
            .and_then(|b| <[u8; PCR_BYTES]>::try_from(b).ok())
            .ok_or_else(|| NitroError::payload(format!("{key}[{index}] is not 48 bytes")))?;
        out.insert(index, pcr);
    }
    Ok(out)
}

fn cabundle(value: Option<Value<'_>>) -> Result<Vec<Cow<'_, [u8]>>, NitroError> {
    let bad = || {
        NitroError::payload(format!(
            "cabundle is not an array of 1..={MAX_CABUNDLE} certificates of 1..={MAX_FIELD_BYTES} bytes"
        ))
    };
    let Some(Value::Array(items)) = value else {
        return Err(bad());
    };
    if !(1..=MAX_CABUNDLE).contains(&items.len()) {
        return Err(bad());
    }
    items
        .into_iter()
        .map(|item| match item {
            Value::Bytes(b) if (1..=MAX_FIELD_BYTES).contains(&b.len()) => Ok(b),
            _ => Err(bad()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document(module_id: &str) -> Document {
        Document {
            module_id: module_id.to_string(),
            timestamp: SystemTime::UNIX_EPOCH,
            kind: Kind::NitroTpm,
            pcrs: BTreeMap::new(),
            nonce: None,
            user_data: None,
            public_key: None,
        }
    }

    #[test]
    fn the_instance_id_is_the_module_id_without_its_module_suffix() {
        for (module_id, want) in [
            (
                "i-01cfb383223e42522-tpm0000000000000000",
                Some("i-01cfb383223e42522"),
            ),
            (
                "i-0a22e5c5f24d22174-enc0191cceb4289903f",
                Some("i-0a22e5c5f24d22174"),
            ),
            ("i-0123-tpm0000000000000000", Some("i-0123")),
            ("i-0123-tpm", None),
            ("i-0123-tpm0000000000000001", None),
            ("i-0123-enc0191cceb4289903", None),
            ("i-01cfb383223e42522", None),
            ("x-01cfb383223e42522-tpm0000000000000000", None),
            ("i--tpm0000000000000000", None),
            ("i-0123-vtpm0000000000000000", None),
            ("i-01z3-tpm0000000000000000", None),
        ] {
            assert_eq!(document(module_id).instance_id(), want, "{module_id}");
        }
    }
}
