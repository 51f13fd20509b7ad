//! Finding the agent's config document in EC2 userData.
//!
//! userData is passed verbatim by Karpenter (`amiFamily: Custom`), so the
//! agent accepts the forms an operator is likely to write:
//!
//! - the TOML document itself;
//! - the same, gzip-compressed (userData is limited to 16 KiB);
//! - one part of a MIME multipart document, with content type
//!   [`CONTENT_TYPE`], beside cloud-init parts (the whole multipart may be
//!   gzip-compressed too, and the part may be base64 and/or gzip).
//!
//! A userData that is only a script or a cloud-config holds no agent config:
//! that is `Ok(None)`, and the config must come from the local file or
//! flags. Pure: bytes in, text out.

use base64::Engine as _;
use std::io::Read as _;

/// MIME content type of the agent's config part.
pub const CONTENT_TYPE: &str = "application/x-autonode-config";
/// Largest decompressed userData accepted: a gzip bomb must not exhaust a
/// node at boot. The raw userData is at most 16 KiB.
pub const MAX_DECOMPRESSED: usize = 1024 * 1024;

/// Why userData could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UserDataError {
    #[error("userData is gzip-compressed but does not decompress: {0}")]
    Gzip(String),
    #[error("userData decompresses to more than {MAX_DECOMPRESSED} bytes")]
    TooLarge,
    #[error("userData MIME multipart: {0}")]
    Mime(String),
    #[error("userData has {0} parts of type {CONTENT_TYPE}; expected at most one")]
    DuplicatePart(usize),
    #[error("the autonode config in userData is not UTF-8")]
    NotUtf8,
}

/// Returns the agent's config document from userData, or `None` when the
/// userData holds no agent config.
pub fn extract(raw: &[u8]) -> Result<Option<String>, UserDataError> {
    let data = gunzip_if_compressed(raw)?;
    if is_mime(&data) {
        return extract_from_mime(&data);
    }
    if is_cloud_init(&data) || data.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    utf8(data).map(Some)
}

fn utf8(data: Vec<u8>) -> Result<String, UserDataError> {
    String::from_utf8(data).map_err(|_| UserDataError::NotUtf8)
}

/// cloud-init's markers for its own formats (scripts, cloud-config, ...).
fn is_cloud_init(data: &[u8]) -> bool {
    ["#!", "#cloud-", "#include", "#part-handler", "#upstart-job"]
        .iter()
        .any(|marker| data.starts_with(marker.as_bytes()))
}

fn gunzip_if_compressed(raw: &[u8]) -> Result<Vec<u8>, UserDataError> {
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw.to_vec());
    }
    let mut out = Vec::new();
    let limit = MAX_DECOMPRESSED as u64 + 1;
    flate2::read::GzDecoder::new(raw)
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| UserDataError::Gzip(e.to_string()))?;
    if out.len() > MAX_DECOMPRESSED {
        return Err(UserDataError::TooLarge);
    }
    Ok(out)
}

/// A MIME message starts with headers, one of which is a multipart
/// Content-Type (cloud-init's `write-mime-multipart` starts with it, or
/// with `MIME-Version`).
fn is_mime(data: &[u8]) -> bool {
    let (headers, _) = split_headers(data);
    headers.iter().any(|(name, value)| {
        name == "content-type" && value.to_ascii_lowercase().starts_with("multipart/")
    })
}

fn extract_from_mime(data: &[u8]) -> Result<Option<String>, UserDataError> {
    let (headers, body) = split_headers(data);
    let content_type = header(&headers, "content-type").unwrap_or_default();
    let boundary = parameter(&content_type, "boundary")
        .ok_or_else(|| UserDataError::Mime("multipart Content-Type has no boundary".into()))?;
    let mut found = Vec::new();
    for part in split_parts(body, &boundary)? {
        let (part_headers, part_body) = split_headers(part);
        let part_type = header(&part_headers, "content-type").unwrap_or_default();
        if media_type(&part_type) == CONTENT_TYPE {
            let encoding = header(&part_headers, "content-transfer-encoding");
            found.push(decode_part(part_body, encoding.as_deref())?);
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => {
            let part = gunzip_if_compressed(&found.remove(0))?;
            utf8(part).map(Some)
        }
        n => Err(UserDataError::DuplicatePart(n)),
    }
}

fn decode_part(body: &[u8], encoding: Option<&str>) -> Result<Vec<u8>, UserDataError> {
    match encoding.map(|e| e.trim().to_ascii_lowercase()).as_deref() {
        None | Some("7bit" | "8bit" | "binary") => Ok(body.to_vec()),
        Some("base64") => {
            let compact: Vec<u8> = body
                .iter()
                .copied()
                .filter(|b| !b.is_ascii_whitespace())
                .collect();
            base64::engine::general_purpose::STANDARD
                .decode(compact)
                .map_err(|e| UserDataError::Mime(format!("{CONTENT_TYPE} part: bad base64: {e}")))
        }
        Some(other) => Err(UserDataError::Mime(format!(
            "{CONTENT_TYPE} part: unsupported Content-Transfer-Encoding {other:?}"
        ))),
    }
}

/// Splits a header block from the body at the first empty line. Header names
/// are lower-cased; folded lines are joined.
fn split_headers(data: &[u8]) -> (Vec<(String, String)>, &[u8]) {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut offset = 0;
    while offset < data.len() {
        let end = data[offset..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(data.len(), |i| offset + i);
        let line = String::from_utf8_lossy(&data[offset..end]);
        let line = line.trim_end_matches('\r');
        offset = (end + 1).min(data.len());
        if line.is_empty() {
            return (headers, &data[offset..]);
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = headers.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        match line.split_once(':') {
            Some((name, value)) => {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()))
            }
            // Not a header: this is no MIME header block.
            None => return (Vec::new(), data),
        }
    }
    (headers, &data[data.len()..])
}

fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
}

fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// A `name=value` or `name="value"` parameter of a header value.
fn parameter(value: &str, name: &str) -> Option<String> {
    value.split(';').skip(1).find_map(|param| {
        let (key, val) = param.split_once('=')?;
        (key.trim().eq_ignore_ascii_case(name)).then(|| val.trim().trim_matches('"').to_string())
    })
}

/// The parts between `--boundary` lines, up to `--boundary--`. The line
/// break before a delimiter belongs to the delimiter (RFC 2046).
fn split_parts<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<&'a [u8]>, UserDataError> {
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut part_start: Option<usize> = None;
    let mut offset = 0;
    while offset < body.len() {
        let end = body[offset..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(body.len(), |i| offset + i);
        let line = body[offset..end]
            .strip_suffix(b"\r")
            .unwrap_or(&body[offset..end]);
        let line = trim_trailing_space(line);
        let is_close = line == format!("{delimiter}--").as_bytes();
        if line == delimiter.as_bytes() || is_close {
            if let Some(start) = part_start {
                parts.push(strip_line_break(&body[start..offset.max(start)]));
            }
            if is_close {
                return Ok(parts);
            }
            part_start = Some((end + 1).min(body.len()));
        }
        offset = end + 1;
    }
    Err(UserDataError::Mime(format!(
        "no closing boundary {delimiter}--"
    )))
}

fn trim_trailing_space(line: &[u8]) -> &[u8] {
    let len = line
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(0, |i| i + 1);
    &line[..len]
}

fn strip_line_break(part: &[u8]) -> &[u8] {
    let part = part.strip_suffix(b"\n").unwrap_or(part);
    part.strip_suffix(b"\r").unwrap_or(part)
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

    #[test]
    fn plain_toml() {
        assert_eq!(extract(DOC.as_bytes()).unwrap().as_deref(), Some(DOC));
    }

    #[test]
    fn gzip_toml() {
        assert_eq!(
            extract(&gzip(DOC.as_bytes())).unwrap().as_deref(),
            Some(DOC)
        );
    }

    #[test]
    fn mime_with_other_parts() {
        let data = mime(&[
            ("text/x-shellscript", None, "#!/bin/sh\necho hi"),
            (CONTENT_TYPE, Some("7bit"), DOC.trim_end()),
            ("text/cloud-config", None, "#cloud-config\nruncmd: []"),
        ]);
        assert_eq!(
            extract(data.as_bytes()).unwrap().as_deref(),
            Some(DOC.trim_end())
        );
    }

    #[test]
    fn mime_base64_part_and_gzip_whole() {
        let encoded = base64::engine::general_purpose::STANDARD.encode(DOC);
        let data = mime(&[(CONTENT_TYPE, Some("base64"), &encoded)]);
        assert_eq!(
            extract(&gzip(data.as_bytes())).unwrap().as_deref(),
            Some(DOC)
        );
    }

    #[test]
    fn mime_without_our_part_is_none() {
        let data = mime(&[("text/x-shellscript", None, "#!/bin/sh\ntrue")]);
        assert_eq!(extract(data.as_bytes()).unwrap(), None);
    }

    #[test]
    fn scripts_and_empty_are_none() {
        assert_eq!(extract(b"#!/bin/bash\necho\n").unwrap(), None);
        assert_eq!(extract(b"#cloud-config\n{}\n").unwrap(), None);
        assert_eq!(extract(b"").unwrap(), None);
    }

    #[test]
    fn broken_forms_are_errors() {
        let truncated = &gzip(DOC.as_bytes())[..12];
        assert!(matches!(extract(truncated), Err(UserDataError::Gzip(_))));
        let unclosed =
            "Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\nx\n";
        assert!(matches!(
            extract(unclosed.as_bytes()),
            Err(UserDataError::Mime(_))
        ));
        let no_boundary = "Content-Type: multipart/mixed\n\n";
        assert!(matches!(
            extract(no_boundary.as_bytes()),
            Err(UserDataError::Mime(_))
        ));
        let twice = mime(&[(CONTENT_TYPE, None, DOC), (CONTENT_TYPE, None, DOC)]);
        assert_eq!(
            extract(twice.as_bytes()),
            Err(UserDataError::DuplicatePart(2))
        );
        assert_eq!(extract(&[0xff, 0xfe, 0x00]), Err(UserDataError::NotUtf8));
    }

    #[test]
    fn gzip_bomb_is_refused() {
        let bomb = gzip(&vec![b'a'; MAX_DECOMPRESSED + 10]);
        assert_eq!(extract(&bomb), Err(UserDataError::TooLarge));
    }
}
