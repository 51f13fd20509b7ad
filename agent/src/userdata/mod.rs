//! Finding the agent's config document in EC2 userData, reading userData
//! the way cloud-init reads it.
//!
//! userData is passed verbatim by Karpenter (`amiFamily: Custom`) and is
//! often written for cloud-init, so the agent splits it into the parts
//! cloud-init would see ([`parts`], proven against cloud-init's own code by
//! the `userdata_oracle` integration test):
//!
//! - gzip-compressed userData is decompressed first (at most
//!   [`MAX_DECOMPRESSED`] bytes);
//! - it is MIME when `MIME-Version:` appears in its first 4096 bytes; the
//!   parts of nested multiparts are flattened, a missing closing boundary
//!   and a header block with no blank line before the first boundary are
//!   forgiven, part bodies are base64 or quoted-printable decoded, and parts
//!   of a gzip type are decompressed;
//! - otherwise it is one part of type `text/x-not-multipart`;
//! - parts of type `text/plain`, `text/x-not-multipart` and
//!   `text/x-shellscript` get the type their first line says (`#!`,
//!   `#cloud-config`, ...), as cloud-init sniffs them.
//!
//! The agent's config ([`extract`]) is then the one part of type
//! [`CONTENT_TYPE`] or [`TEXT_CONTENT_TYPE`] (`cloud-init devel make-mime`
//! can only write `text/...` types), possibly gzip-compressed itself, or a
//! whole non-MIME userData that is TOML with an autonode key. Anything else
//! (a script, a cloud-config, Bottlerocket's TOML settings, an Ignition
//! config, which the OS's Ignition reads) holds no agent config: that is
//! [`Extracted::Elsewhere`], saying what was found, and the config must
//! come from the local file or flags. Unlike cloud-init, the agent fetches
//! nothing: `#include` and `#cloud-config-archive` parts are listed as
//! themselves. Pure: bytes in, text out.

mod mime;

use base64::Engine as _;
use std::fmt;
use std::io::Read as _;

/// MIME content type of the agent's config part.
pub const CONTENT_TYPE: &str = "application/x-autonode-config";
/// The same, as a `text/` type: what `cloud-init devel make-mime` writes.
pub const TEXT_CONTENT_TYPE: &str = "text/x-autonode-config";
/// Largest decompressed userData accepted: a gzip bomb must not exhaust a
/// node at boot. The raw userData is at most 16 KiB.
pub const MAX_DECOMPRESSED: usize = 1024 * 1024;
/// cloud-init's type for a userData that is not MIME.
pub const NOT_MULTIPART: &str = "text/x-not-multipart";

/// Top-level TOML keys of the agent's config (`config::Document`): a TOML
/// userData with one of them is meant for the agent.
const AUTONODE_KEYS: [&str; 5] = [
    "server-url",
    "server-ca",
    "server-ca-sha256",
    "cluster-name",
    "options",
];

/// Part types cloud-init decompresses before looking at them.
const GZIP_TYPES: [&str; 8] = [
    "application/gzip",
    "application/gzip-compressed",
    "application/gzipped",
    "application/x-compress",
    "application/x-compressed",
    "application/x-gunzip",
    "application/x-gzip",
    "application/x-gzip-compressed",
];
/// Part types whose real type cloud-init takes from their first line.
const SNIFFED_TYPES: [&str; 3] = ["text/plain", NOT_MULTIPART, "text/x-shellscript"];
/// cloud-init's first-line markers, longest first so that the longest
/// match wins (`#cloud-config-archive` over `#cloud-config`).
const MARKERS: [(&str, &str); 12] = [
    (
        "text/x-shellscript-per-instance",
        "text/x-shellscript-per-instance",
    ),
    ("text/x-shellscript-per-boot", "text/x-shellscript-per-boot"),
    ("text/x-shellscript-per-once", "text/x-shellscript-per-once"),
    ("#cloud-config-archive", "text/cloud-config-archive"),
    ("#cloud-config-jsonp", "text/cloud-config-jsonp"),
    ("## template: jinja", "text/jinja2"),
    ("#cloud-boothook", "text/cloud-boothook"),
    ("#include-once", "text/x-include-once-url"),
    ("#cloud-config", "text/cloud-config"),
    ("#part-handler", "text/part-handler"),
    ("#include", "text/x-include-url"),
    ("#!", "text/x-shellscript"),
];

/// Why userData could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UserDataError {
    #[error("userData is gzip-compressed but does not decompress: {0}")]
    Gzip(String),
    #[error("userData decompresses to more than {MAX_DECOMPRESSED} bytes")]
    TooLarge,
    #[error("userData MIME multipart: {0}")]
    Mime(String),
    #[error(
        "userData has {0} parts of type {CONTENT_TYPE} or {TEXT_CONTENT_TYPE}; expected at most one"
    )]
    DuplicatePart(usize),
    #[error("the autonode config in userData is not UTF-8")]
    NotUtf8,
}

/// One part of userData as cloud-init sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Lower-cased media type, after cloud-init's sniffing.
    pub content_type: String,
    /// The body, transfer-decoded (and decompressed for gzip types).
    pub payload: Vec<u8>,
}

/// userData split into parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Read as MIME (else `parts` is the one whole userData).
    pub mime: bool,
    pub parts: Vec<Part>,
}

/// What userData holds for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extracted {
    /// The agent's config document (TOML text, not yet parsed).
    Config(String),
    /// No agent config; what is there instead.
    Elsewhere(Found),
}

/// What a userData without an agent config holds, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Empty,
    /// MIME, with parts of these types and none of the agent's.
    MimeParts(Vec<String>),
    /// Not MIME: one document of a cloud-init type (a script, ...).
    Document(String),
    /// An Ignition config, read by the OS's Ignition.
    Ignition,
    /// TOML without an autonode key: its top-level keys.
    TomlWithoutAutonodeKeys(Vec<String>),
    /// Text that is not TOML: the TOML error.
    NotToml(String),
    /// Neither UTF-8 text nor MIME.
    Binary,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "userData: ")?;
        match self {
            Found::Empty => write!(f, "empty"),
            Found::MimeParts(types) => {
                match types.len() {
                    0 => write!(f, "MIME with no parts")?,
                    1 => write!(f, "1 MIME part: {}", types[0])?,
                    n => write!(f, "{n} MIME parts: {}", types.join(", "))?,
                }
                write!(f, "; no part of type {CONTENT_TYPE} or {TEXT_CONTENT_TYPE}")
            }
            Found::Document(kind) => write!(f, "not MIME, one {kind} document"),
            Found::Ignition => write!(f, "an Ignition config (JSON), for the OS's Ignition"),
            Found::TomlWithoutAutonodeKeys(keys) => write!(
                f,
                "TOML without autonode keys (its top-level keys: {})",
                keys.join(", ")
            ),
            Found::NotToml(error) => {
                write!(f, "text that is not MIME, cloud-init or TOML ({error})")
            }
            Found::Binary => write!(f, "binary data, neither MIME nor text"),
        }
    }
}

/// Splits userData into the parts cloud-init sees.
pub fn parts(raw: &[u8]) -> Result<Parsed, UserDataError> {
    let data = gunzip_if_compressed(raw)?;
    if !mime::declares_mime(&data) {
        let part = as_cloud_init_sees(NOT_MULTIPART.to_string(), data)?;
        return Ok(Parsed {
            mime: false,
            parts: vec![part],
        });
    }
    let mut parts = Vec::new();
    for leaf in mime::leaves(&data)? {
        let payload = match transfer_decode(leaf.body, leaf.encoding.as_deref()) {
            Ok(payload) => payload,
            Err(reason) if is_autonode_type(&leaf.content_type) => {
                return Err(UserDataError::Mime(format!(
                    "{} part: {reason}",
                    leaf.content_type
                )))
            }
            // cloud-init keeps such a body as it is.
            Err(_) => leaf.body.to_vec(),
        };
        parts.push(as_cloud_init_sees(leaf.content_type, payload)?);
    }
    Ok(Parsed { mime: true, parts })
}

/// Returns the agent's config document from userData, or what userData
/// holds instead.
pub fn extract(raw: &[u8]) -> Result<Extracted, UserDataError> {
    let parsed = parts(raw)?;
    if !parsed.mime {
        return Ok(parsed
            .parts
            .into_iter()
            .next()
            .map_or(Extracted::Elsewhere(Found::Empty), whole));
    }
    let (mut ours, others): (Vec<Part>, Vec<Part>) = parsed
        .parts
        .into_iter()
        .partition(|part| is_autonode_type(&part.content_type));
    match ours.len() {
        0 => Ok(Extracted::Elsewhere(Found::MimeParts(
            others.into_iter().map(|p| p.content_type).collect(),
        ))),
        1 => {
            let payload = gunzip_if_compressed(&ours.remove(0).payload)?;
            let text = String::from_utf8(payload).map_err(|_| UserDataError::NotUtf8)?;
            Ok(Extracted::Config(text))
        }
        n => Err(UserDataError::DuplicatePart(n)),
    }
}

pub fn is_autonode_type(content_type: &str) -> bool {
    content_type == CONTENT_TYPE || content_type == TEXT_CONTENT_TYPE
}

/// A whole, non-MIME userData: the agent's when it is TOML with an
/// autonode key, or broken TOML that plainly sets one (so the TOML error
/// is reported, not ignored).
fn whole(part: Part) -> Extracted {
    if part.content_type != NOT_MULTIPART {
        return Extracted::Elsewhere(Found::Document(part.content_type));
    }
    let Ok(text) = String::from_utf8(part.payload) else {
        return Extracted::Elsewhere(Found::Binary);
    };
    if text.trim().is_empty() {
        return Extracted::Elsewhere(Found::Empty);
    }
    match text.parse::<toml::Table>() {
        Ok(table) if table.keys().any(|k| is_autonode_key(k)) => Extracted::Config(text),
        Ok(table) => Extracted::Elsewhere(Found::TomlWithoutAutonodeKeys(
            table.keys().cloned().collect(),
        )),
        Err(_) if is_ignition(&text) => Extracted::Elsewhere(Found::Ignition),
        Err(_) if sets_autonode_key(&text) => Extracted::Config(text),
        Err(error) => Extracted::Elsewhere(Found::NotToml(toml_error_line(&error))),
    }
}

/// Autonode's keys, forgiving case and `_` for `-` (so that a typo'd key
/// still makes the document ours, and its error is reported).
fn is_autonode_key(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase().replace('_', "-");
    AUTONODE_KEYS.contains(&key.as_str())
}

/// A line `key = ...` or `[options]` with an autonode key.
fn sets_autonode_key(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim();
        if let Some(table) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            return is_autonode_key(table);
        }
        line.split_once('=')
            .is_some_and(|(key, _)| is_autonode_key(key.trim().trim_matches('"')))
    })
}

fn is_ignition(text: &str) -> bool {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text)
        .is_ok_and(|object| object.contains_key("ignition"))
}

/// The TOML error on one line: its message and where.
fn toml_error_line(error: &toml::de::Error) -> String {
    let message = error.message().trim();
    match error.span() {
        Some(span) => format!("TOML error at byte {}: {message}", span.start),
        None => format!("TOML error: {message}"),
    }
}

/// The type cloud-init gives a part, and its payload after cloud-init's
/// decompression of gzip types.
fn as_cloud_init_sees(content_type: String, payload: Vec<u8>) -> Result<Part, UserDataError> {
    let (mut content_type, payload) = if GZIP_TYPES.contains(&content_type.as_str()) {
        ("text/plain".to_string(), gunzip(&payload)?)
    } else {
        (content_type, payload)
    };
    if SNIFFED_TYPES.contains(&content_type.as_str()) {
        if let Some(sniffed) = sniff(&payload) {
            content_type = sniffed.to_string();
        }
    }
    Ok(Part {
        content_type,
        payload,
    })
}

/// The type cloud-init reads from a payload's start: after leading blanks,
/// case-insensitive.
fn sniff(payload: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(payload);
    // Python's str.isspace also counts the ASCII separators 0x1c-0x1f.
    let text =
        text.trim_start_matches(|c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c));
    MARKERS.iter().find_map(|(marker, content_type)| {
        text.as_bytes()
            .get(..marker.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(marker.as_bytes()))
            .then_some(*content_type)
    })
}

/// Undoes a Content-Transfer-Encoding as Python's `email` does; `Err` with
/// why when the body cannot be decoded.
fn transfer_decode(body: &[u8], encoding: Option<&str>) -> Result<Vec<u8>, String> {
    match encoding.map(str::trim) {
        None | Some("" | "7bit" | "8bit" | "binary") => Ok(body.to_vec()),
        Some("base64") => decode_base64(body),
        Some("quoted-printable") => Ok(decode_quoted_printable(body)),
        Some(other) => Err(format!("unsupported Content-Transfer-Encoding {other:?}")),
    }
}

/// Lenient like Python's: characters outside the alphabet are skipped and
/// padding may be missing.
fn decode_base64(body: &[u8]) -> Result<Vec<u8>, String> {
    let alphabet: Vec<u8> = body
        .iter()
        .copied()
        .take_while(|&b| b != b'=')
        .filter(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/'))
        .collect();
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    );
    engine
        .decode(alphabet)
        .map_err(|e| format!("bad base64: {e}"))
}

/// `=XX` is a byte, `=` at a line's end joins it to the next line, and
/// any other `=` is kept.
fn decode_quoted_printable(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let rest = &body[i..];
        if rest[0] != b'=' {
            out.push(rest[0]);
            i += 1;
        } else if rest.starts_with(b"=\r\n") {
            i += 3;
        } else if rest.starts_with(b"=\n") || rest.starts_with(b"=\r") {
            i += 2;
        } else if let Some(byte) = rest.get(1..3).and_then(hex_byte) {
            out.push(byte);
            i += 3;
        } else {
            out.push(b'=');
            i += 1;
        }
    }
    out
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    let text = std::str::from_utf8(pair).ok()?;
    u8::from_str_radix(text, 16).ok()
}

fn gunzip_if_compressed(raw: &[u8]) -> Result<Vec<u8>, UserDataError> {
    if raw.starts_with(&[0x1f, 0x8b]) {
        gunzip(raw)
    } else {
        Ok(raw.to_vec())
    }
}

/// Decompresses every gzip member (as Python's gzip module does), up to
/// [`MAX_DECOMPRESSED`] bytes.
fn gunzip(raw: &[u8]) -> Result<Vec<u8>, UserDataError> {
    let mut out = Vec::new();
    let limit = MAX_DECOMPRESSED as u64 + 1;
    flate2::read::MultiGzDecoder::new(raw)
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| UserDataError::Gzip(e.to_string()))?;
    if out.len() > MAX_DECOMPRESSED {
        return Err(UserDataError::TooLarge);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use std::io::Write as _;

    const DOC: &str = "server-url = \"https://10.0.0.1:8443\"\ncluster-name = \"c\"\n";

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    fn mime(parts: &[(&str, Option<&str>, &str)]) -> String {
        let mut out = String::from(
            "Content-Type: multipart/mixed; boundary=\"==BOUNDARY==\"\r\nMIME-Version: 1.0\r\n\r\npreamble\r\n",
        );
        for (content_type, encoding, body) in parts {
            out.push_str(&format!(
                "--==BOUNDARY==\r\nContent-Type: {content_type}; charset=\"us-ascii\"\r\n"
            ));
            if let Some(encoding) = encoding {
                out.push_str(&format!("Content-Transfer-Encoding: {encoding}\r\n"));
            }
            out.push_str(&format!("\r\n{body}\r\n"));
        }
        out.push_str("--==BOUNDARY==--\r\n");
        out
    }

    fn config(data: &[u8]) -> String {
        match extract(data).unwrap() {
            Extracted::Config(text) => text,
            Extracted::Elsewhere(found) => panic!("no config: {found}"),
        }
    }

    fn elsewhere(data: &[u8]) -> Found {
        match extract(data).unwrap() {
            Extracted::Elsewhere(found) => found,
            Extracted::Config(text) => panic!("read as config: {text}"),
        }
    }

    #[test]
    fn plain_and_gzip_toml() {
        assert_eq!(config(DOC.as_bytes()), DOC);
        assert_eq!(config(&gzip(DOC.as_bytes())), DOC);
    }

    #[test]
    fn mime_with_other_parts_both_types() {
        for our_type in [CONTENT_TYPE, TEXT_CONTENT_TYPE, "Text/X-Autonode-Config"] {
            let data = mime(&[
                ("text/x-shellscript", None, "#!/bin/sh\necho hi"),
                (our_type, Some("7bit"), DOC.trim_end()),
                ("text/cloud-config", None, "#cloud-config\nruncmd: []"),
            ]);
            assert_eq!(config(data.as_bytes()), DOC.trim_end());
        }
    }

    #[test]
    fn mime_encoded_parts_and_gzip_whole() {
        let encoded = base64::engine::general_purpose::STANDARD.encode(DOC);
        let data = mime(&[(CONTENT_TYPE, Some("base64"), &encoded)]);
        assert_eq!(config(&gzip(data.as_bytes())), DOC);
        let encoded = base64::engine::general_purpose::STANDARD.encode(gzip(DOC.as_bytes()));
        let data = mime(&[(TEXT_CONTENT_TYPE, Some("base64"), &encoded)]);
        assert_eq!(config(data.as_bytes()), DOC);
        let data = mime(&[(
            CONTENT_TYPE,
            Some("quoted-printable"),
            "server-url =3D \"https://x\"=\r\n\ncluster-name = \"c=3Dd\"",
        )]);
        assert_eq!(
            config(data.as_bytes()),
            "server-url = \"https://x\"\ncluster-name = \"c=d\""
        );
    }

    #[test]
    fn karpenter_al2023_style_without_closing_boundary() {
        let data = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"//\"\n\n\
            --//\nContent-Type: application/node.eks.aws\n\n---\nkind: NodeConfig\n\
            --//\nContent-Type: text/x-autonode-config\n\nserver-url = \"https://x\"\n\
            --//\n";
        assert_eq!(config(data.as_bytes()), "server-url = \"https://x\"");
        let parsed = parts(data.as_bytes()).unwrap();
        let types: Vec<&str> = parsed
            .parts
            .iter()
            .map(|p| p.content_type.as_str())
            .collect();
        assert_eq!(
            types,
            ["application/node.eks.aws", TEXT_CONTENT_TYPE, "text/plain"]
        );
    }

    #[test]
    fn terraform_style_without_blank_line_is_mime() {
        let data = "Content-Type: multipart/mixed; boundary=\"MIMEBOUNDARY\"\nMIME-Version: 1.0\n\
            --MIMEBOUNDARY\nContent-Transfer-Encoding: 7bit\nContent-Type: application/x-autonode-config\n\n\
            server-url = \"https://x\"\n--MIMEBOUNDARY--\n";
        assert_eq!(config(data.as_bytes()), "server-url = \"https://x\"");
    }

    #[test]
    fn what_is_not_ours_is_described() {
        let data = mime(&[
            ("text/x-shellscript", None, "#!/bin/sh\ntrue"),
            ("text/plain", None, "#cloud-config\n{}"),
        ]);
        let found = elsewhere(data.as_bytes());
        assert_eq!(
            found.to_string(),
            "userData: 2 MIME parts: text/x-shellscript, text/cloud-config; \
             no part of type application/x-autonode-config or text/x-autonode-config"
        );
        assert_eq!(
            elsewhere(b"#!/bin/bash\necho\n"),
            Found::Document("text/x-shellscript".into())
        );
        assert_eq!(
            elsewhere(b"  #Cloud-Config\n{}\n"),
            Found::Document("text/cloud-config".into())
        );
        assert_eq!(elsewhere(b""), Found::Empty);
        assert_eq!(elsewhere(b" \n\t"), Found::Empty);
        assert_eq!(
            elsewhere(b"[settings.kubernetes]\napi-server = \"https://x\"\n"),
            Found::TomlWithoutAutonodeKeys(vec!["settings".into()])
        );
        assert_eq!(
            elsewhere(br#"{"ignition": {"version": "3.4.0"}}"#),
            Found::Ignition
        );
        assert!(matches!(elsewhere(b"echo hello\n"), Found::NotToml(e) if e.contains("byte")));
        assert_eq!(elsewhere(&[0xff, 0xfe, 0x00]), Found::Binary);
        // No MIME-Version: cloud-init reads it as one document, and so do we.
        let no_version = "Content-Type: multipart/mixed; boundary=b\n\n--b\n\nx\n--b--\n";
        assert!(matches!(
            elsewhere(no_version.as_bytes()),
            Found::NotToml(_)
        ));
    }

    #[test]
    fn toml_plainly_for_autonode_stays_ours_even_when_broken() {
        // Typo'd and unknown keys are for config to refuse by name.
        assert_eq!(config(b"server_url = \"x\"\n"), "server_url = \"x\"\n");
        assert_eq!(
            config(b"[options]\ndeadlin = 1\n"),
            "[options]\ndeadlin = 1\n"
        );
        // Not TOML, but it sets our key: the TOML error must surface.
        assert_eq!(
            config(b"server-url = \"https://x\n"),
            "server-url = \"https://x\n"
        );
    }

    #[test]
    fn broken_forms_are_errors() {
        let truncated = &gzip(DOC.as_bytes())[..12];
        assert!(matches!(extract(truncated), Err(UserDataError::Gzip(_))));
        let twice = mime(&[(CONTENT_TYPE, None, DOC), (TEXT_CONTENT_TYPE, None, DOC)]);
        assert_eq!(
            extract(twice.as_bytes()),
            Err(UserDataError::DuplicatePart(2))
        );
        let not_utf8 = mime(&[(CONTENT_TYPE, Some("base64"), "//79")]);
        assert_eq!(extract(not_utf8.as_bytes()), Err(UserDataError::NotUtf8));
        let bad_base64 = mime(&[(CONTENT_TYPE, Some("base64"), "QUJDR")]);
        assert!(
            matches!(extract(bad_base64.as_bytes()), Err(UserDataError::Mime(m)) if m.contains("base64"))
        );
        let odd = mime(&[(CONTENT_TYPE, Some("x-uuencode"), "begin")]);
        assert!(
            matches!(extract(odd.as_bytes()), Err(UserDataError::Mime(m)) if m.contains("x-uuencode"))
        );
        // Others' undecodable parts are kept as they are, as cloud-init does.
        let theirs = mime(&[("text/x-foo", Some("base64"), "QUJDR")]);
        assert_eq!(parts(theirs.as_bytes()).unwrap().parts[0].payload, b"QUJDR");
        let bad_gzip_part = mime(&[("application/x-gzip", None, "not gzip")]);
        assert!(matches!(
            extract(bad_gzip_part.as_bytes()),
            Err(UserDataError::Gzip(_))
        ));
    }

    #[test]
    fn gzip_parts_are_decompressed_and_sniffed() {
        let encoded = base64::engine::general_purpose::STANDARD.encode(gzip(b"#!/bin/sh\ntrue\n"));
        let data = mime(&[("application/x-gzip", Some("base64"), &encoded)]);
        let parsed = parts(data.as_bytes()).unwrap();
        assert_eq!(parsed.parts[0].content_type, "text/x-shellscript");
        assert_eq!(parsed.parts[0].payload, b"#!/bin/sh\ntrue\n");
    }

    #[test]
    fn sniffing_prefers_the_longest_marker() {
        assert_eq!(
            sniff(b"#cloud-config-archive\n- x"),
            Some("text/cloud-config-archive")
        );
        assert_eq!(
            sniff(b"#include-once\nhttp://x"),
            Some("text/x-include-once-url")
        );
        assert_eq!(sniff(b"\x1c #!/bin/sh"), Some("text/x-shellscript"));
        assert_eq!(sniff(b"server-url = 1"), None);
    }

    #[test]
    fn gzip_bomb_is_refused() {
        let bomb = gzip(&vec![b'a'; MAX_DECOMPRESSED + 10]);
        assert_eq!(extract(&bomb), Err(UserDataError::TooLarge));
        let mut two_members = gzip(&vec![b'a'; MAX_DECOMPRESSED / 2 + 10]);
        two_members.extend(gzip(&vec![b'a'; MAX_DECOMPRESSED / 2 + 10]));
        assert_eq!(extract(&two_members), Err(UserDataError::TooLarge));
        let part = base64::engine::general_purpose::STANDARD.encode(&bomb);
        let data = mime(&[("application/gzip", Some("base64"), &part)]);
        assert_eq!(extract(data.as_bytes()), Err(UserDataError::TooLarge));
    }
}
