//! File contents: `data:` URLs (RFC 2397), gzip, and hash verification.
//!
//! As strict as Ignition's own decoder (checked against Debian's
//! `ignition-validate` 2.14): the media type must be `type/subtype` or
//! empty, parameters `attribute=value`, the `base64` marker lower-case;
//! plain data may hold only URI characters and `%XX` escapes, base64 data
//! only the base64 alphabet (so no `%0A` or other escapes inside it).
//! Shared so the server decodes and verifies at render time what the
//! agent will write.

use super::types::Contents;
use super::SpecError;
use base64::engine::{general_purpose::GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use sha2::{Digest as _, Sha256, Sha512};
use std::io::Read as _;

/// Largest decompressed file: protects the node (and the server, which
/// decodes at render time) from a gzip bomb.
pub const MAX_FILE: u64 = 64 * 1024 * 1024;

/// Go's `base64.StdEncoding`: padded, and lenient about non-zero trailing
/// bits (`YR==` is accepted by Ignition, so by us too).
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// A file's contents: data URL decoded, decompressed, verified. `at` names
/// the entry in errors (a JSON path or the file's path). An empty source is
/// an empty file.
pub fn decode(contents: &Contents, at: &str) -> Result<Vec<u8>, SpecError> {
    let source = contents.source.as_deref().unwrap_or_default();
    let bad = |reason: String| SpecError::Source {
        path: format!("{at}.source"),
        reason,
    };
    let raw = if source.is_empty() {
        Vec::new()
    } else {
        data_url(source).map_err(bad)?
    };
    let data = match contents.compression.as_deref() {
        None | Some("") => raw,
        Some("gzip") => gunzip(&raw).map_err(bad)?,
        Some(other) => {
            return Err(SpecError::Compression {
                path: format!("{at}.compression"),
                value: other.to_string(),
            })
        }
    };
    if let Some(hash) = &contents.verification.hash {
        verify(hash, &data).map_err(|reason| SpecError::Hash {
            path: format!("{at}.verification.hash"),
            reason,
        })?;
    }
    Ok(data)
}

/// Decodes `data:[<type/subtype>][;attr=value]*[;base64],<data>`.
pub fn data_url(url: &str) -> Result<Vec<u8>, String> {
    let rest = url
        .strip_prefix("data:")
        .ok_or("not a data: URL (only inline data: sources are supported)")?;
    let (meta, data) = rest
        .split_once(',')
        .ok_or("data: URL without ',' before the data")?;
    let base64 = media_type(meta)?;
    if base64 {
        if let Some(bad) = data.bytes().find(|b| !is_base64_char(*b)) {
            return Err(format!(
                "bad base64: character {:?} is not in the base64 alphabet (no %-escapes or line breaks inside base64)",
                char::from(bad)
            ));
        }
        return BASE64.decode(data).map_err(|e| format!("bad base64: {e}"));
    }
    percent_decode(data)
}

/// Checks the part between `data:` and `,`; whether it ends in `;base64`.
fn media_type(meta: &str) -> Result<bool, String> {
    let mut parts = meta.split(';');
    let mime = parts.next().unwrap_or_default();
    if !mime.is_empty() {
        let ok = mime
            .split_once('/')
            .is_some_and(|(kind, sub)| is_token(kind) && is_token(sub));
        if !ok {
            return Err(format!(
                "bad media type {mime:?} in data: URL (want type/subtype)"
            ));
        }
    }
    let params: Vec<&str> = parts.collect();
    let (base64, params) = match params.split_last() {
        Some((&"base64", rest)) => (true, rest),
        _ => (false, &params[..]),
    };
    for param in params {
        let ok = param
            .split_once('=')
            .is_some_and(|(name, value)| is_token(name) && is_token(value));
        if !ok {
            return Err(format!(
                "bad parameter {param:?} in data: URL (want name=value, or a final lower-case ;base64)"
            ));
        }
    }
    Ok(base64)
}

/// An RFC 2045 token: printable ASCII without separators.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?=".contains(&b))
}

fn is_base64_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')
}

/// RFC 2396 `uric` characters, which plain data may hold unescaped.
fn is_uri_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b";/?:@&=+$,-_.!~*'()".contains(&b)
}

fn percent_decode(data: &str) -> Result<Vec<u8>, String> {
    let bytes = data.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let byte = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad %-escape at byte {i} of the data"))?;
            out.push(byte);
            i += 3;
        } else if is_uri_char(b) {
            out.push(b);
            i += 1;
        } else {
            return Err(format!(
                "character {:?} at byte {i} must be %-escaped in a data: URL",
                String::from_utf8_lossy(&bytes[i..=i])
            ));
        }
    }
    Ok(out)
}

fn gunzip(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(MAX_FILE + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("not valid gzip: {e}"))?;
    if out.len() as u64 > MAX_FILE {
        return Err(format!("decompresses to more than {MAX_FILE} bytes"));
    }
    Ok(out)
}

/// Checks the form of `sha256-<64 hex>` or `sha512-<128 hex>`; the digest
/// function and the expected digest in lower case.
pub(super) fn parse_hash(hash: &str) -> Result<(&'static str, String), String> {
    let (function, hex) = hash
        .split_once('-')
        .ok_or_else(|| format!("{hash:?} is not <function>-<hex digest>"))?;
    let (function, len) = match function {
        "sha256" => ("sha256", 64),
        "sha512" => ("sha512", 128),
        other => {
            return Err(format!(
                "unsupported hash function {other:?} (sha256 or sha512)"
            ))
        }
    };
    if hex.len() != len || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{function} digest must be {len} hex digits, got {hex:?}"
        ));
    }
    Ok((function, hex.to_ascii_lowercase()))
}

/// Verifies `data` against `hash` (see `parse_hash`).
pub fn verify(hash: &str, data: &[u8]) -> Result<(), String> {
    let (function, expected) = parse_hash(hash)?;
    let actual = match function {
        "sha256" => Sha256::digest(data).to_vec(),
        _ => Sha512::digest(data).to_vec(),
    };
    let actual: String = actual.iter().map(|b| format!("{b:02x}")).collect();
    if actual == expected {
        Ok(())
    } else {
        Err(format!(
            "hash mismatch: the contents' {function} is {actual}, not {expected}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls_ignition_accepts() {
        let ok = [
            ("data:,hello%20world%0A", &b"hello world\n"[..]),
            ("data:text/plain;charset=utf-8;base64,aGk=", b"hi"),
            ("data:;base64,aGk=", b"hi"),
            ("data:;base64,YR==", b"a"),
            ("data:;base64,", b""),
            ("data:,", b""),
            ("data:text/plain;a=b,x", b"x"),
            ("data:,a'b()*!~", b"a'b()*!~"),
            ("data:,%0a%C3%A9", "\né".as_bytes()),
        ];
        for (url, want) in ok {
            assert_eq!(data_url(url).as_deref(), Ok(want), "{url}");
        }
    }

    #[test]
    fn data_urls_ignition_refuses() {
        // Each refused by ignition-validate 2.14 too.
        let bad = [
            ("data:;base64,aGk%0A=", "bad base64"),
            ("data:;base64,aG%6B=", "bad base64"),
            ("data:;base64,aGk", "bad base64"),
            ("data:;base64,aG-k", "bad base64"),
            ("data:;BASE64,aGk=", "bad parameter"),
            ("data:text/plain;a,x", "bad parameter"),
            ("data:aGk=", "without ','"),
            ("data:aGk=,x", "bad media type"),
            ("data:text;a=b,x", "bad media type"),
            ("data:,%zz", "bad %-escape"),
            ("data:,a%", "bad %-escape"),
            ("data:,{}", "must be %-escaped"),
            ("data:,a b", "must be %-escaped"),
            ("data:,é", "must be %-escaped"),
            ("DATA:,x", "not a data: URL"),
            ("https://x", "not a data: URL"),
            ("data:x", "without ','"),
        ];
        for (url, want) in bad {
            let err = data_url(url).unwrap_err();
            assert!(err.contains(want), "{url}: {err} should say {want}");
        }
    }

    #[test]
    fn hashes() {
        let sha256 = "sha256-2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
        assert_eq!(verify(sha256, b"hello"), Ok(()));
        assert_eq!(
            verify(&sha256.to_uppercase().replace("SHA256", "sha256"), b"hello"),
            Ok(())
        );
        assert!(verify(sha256, b"hellO").unwrap_err().contains("mismatch"));
        let sha512 = format!("sha512-{}", "0".repeat(128));
        assert!(verify(&sha512, b"x").unwrap_err().contains("mismatch"));
        assert!(verify("sha256-00", b"")
            .unwrap_err()
            .contains("64 hex digits"));
        assert!(verify(&format!("sha256-{}", "g".repeat(64)), b"").is_err());
        assert!(verify("md5-00", b"")
            .unwrap_err()
            .contains("unsupported hash"));
        assert!(verify("sha256", b"").is_err());
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn decode_decompresses_then_verifies() {
        let source = format!("data:;base64,{}", BASE64.encode(gzip(b"hello")));
        let contents = Contents {
            source: Some(source),
            compression: Some("gzip".into()),
            verification: super::super::Verification {
                hash: Some(
                    "sha256-2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
                        .into(),
                ),
            },
        };
        assert_eq!(decode(&contents, "f").unwrap(), b"hello");
        let xz = Contents {
            compression: Some("xz".into()),
            ..contents.clone()
        };
        assert!(matches!(
            decode(&xz, "f"),
            Err(SpecError::Compression { .. })
        ));
        let not_gzip = Contents {
            source: Some("data:,hello".into()),
            ..contents
        };
        let err = decode(&not_gzip, "f").unwrap_err().to_string();
        assert!(err.starts_with("f.source: not valid gzip"), "{err}");
        let empty = Contents {
            source: Some(String::new()),
            ..Contents::default()
        };
        assert_eq!(decode(&empty, "f").unwrap(), b"");
    }

    #[test]
    fn gzip_bombs_are_refused() {
        let bomb = gzip(&vec![0; MAX_FILE as usize + 1]);
        assert!(gunzip(&bomb).unwrap_err().contains("more than"));
    }
}
