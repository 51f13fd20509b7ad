//! The MIME reading of userData, done the way cloud-init does it (with
//! Python's `email` parser), so that the agent sees the parts cloud-init
//! sees: the same headers, boundaries and part bodies, leniencies included.
//!
//! Where that reading forgives, so does this one: a top-level header block
//! that runs straight into the first boundary with no blank line, a missing
//! closing boundary (the last part then runs to the end), a multipart with
//! no boundary parameter or no boundary line (no parts). Nested multiparts
//! are flattened into their leaves, as cloud-init walks them.

use super::UserDataError;

/// cloud-init reads userData as MIME when this appears (any case) in its
/// first [`SNIFF_LEN`] bytes, wherever it is.
const MIME_MARKER: &[u8] = b"mime-version:";
const SNIFF_LEN: usize = 4096;
/// Multiparts nested deeper than this are refused: bounded recursion.
pub const MAX_DEPTH: usize = 16;

/// A part that is not a multipart container, before any decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf<'a> {
    /// Lower-cased media type without parameters; `text/plain` when absent
    /// or malformed (as Python's `get_content_type`).
    pub content_type: String,
    /// The Content-Transfer-Encoding, lower-cased, if any.
    pub encoding: Option<String>,
    pub body: &'a [u8],
}

/// Whether cloud-init reads this (decompressed) userData as MIME.
pub fn declares_mime(data: &[u8]) -> bool {
    let head = &data[..data.len().min(SNIFF_LEN)];
    head.windows(MIME_MARKER.len())
        .any(|window| window.eq_ignore_ascii_case(MIME_MARKER))
}

/// The leaves of a MIME message, in document order.
pub fn leaves(data: &[u8]) -> Result<Vec<Leaf<'_>>, UserDataError> {
    let mut out = Vec::new();
    collect(data, 0, &mut out)?;
    Ok(out)
}

fn collect<'a>(data: &'a [u8], depth: usize, out: &mut Vec<Leaf<'a>>) -> Result<(), UserDataError> {
    let (headers, body) = split_headers(data);
    let raw_type = header(&headers, "content-type").unwrap_or_default();
    let content_type = media_type(raw_type);
    if !content_type.starts_with("multipart/") {
        let encoding = header(&headers, "content-transfer-encoding").map(str::to_ascii_lowercase);
        out.push(Leaf {
            content_type,
            encoding,
            body,
        });
        return Ok(());
    }
    if depth >= MAX_DEPTH {
        return Err(UserDataError::Mime(format!(
            "multiparts nested more than {MAX_DEPTH} deep"
        )));
    }
    // No boundary, or no boundary line: Python keeps the body as text and
    // cloud-init finds no part in it.
    let Some(boundary) = parameter(raw_type, "boundary") else {
        return Ok(());
    };
    for part in split_parts(body, boundary.trim_end()) {
        collect(part, depth + 1, out)?;
    }
    Ok(())
}

/// One line of `data`: `start..end` is its text, `next` where the next one
/// begins. Line breaks are `\r\n`, `\r` or `\n`, as in Python's parser.
#[derive(Debug, Clone, Copy)]
struct Line {
    start: usize,
    end: usize,
    next: usize,
}

fn lines(data: &[u8]) -> impl Iterator<Item = Line> + '_ {
    let mut offset = 0;
    std::iter::from_fn(move || {
        if offset >= data.len() {
            return None;
        }
        let start = offset;
        let end = data[start..]
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
            .map_or(data.len(), |i| start + i);
        let next = match data.get(end..end + 2) {
            Some(b"\r\n") => end + 2,
            _ => (end + 1).min(data.len()),
        };
        offset = next;
        Some(Line { start, end, next })
    })
}

/// Splits the header block from the body. The block ends at an empty line
/// (dropped) or at the first line that is no header (kept in the body, as
/// Python does for a missing separator). Names are lower-cased; folded
/// lines are joined.
fn split_headers(data: &[u8]) -> (Vec<(String, String)>, &[u8]) {
    let mut headers: Vec<(String, String)> = Vec::new();
    for (index, line) in lines(data).enumerate() {
        let text = &data[line.start..line.end];
        if text.is_empty() {
            return (headers, &data[line.next..]);
        }
        if text.starts_with(b" ") || text.starts_with(b"\t") {
            if let Some((_, value)) = headers.last_mut() {
                value.push(' ');
                value.push_str(String::from_utf8_lossy(text).trim());
            }
            continue;
        }
        // An mbox envelope line ("From sender date") is no header.
        if text.starts_with(b"From ") && index == 0 {
            continue;
        }
        match name_length(text) {
            Some(0) => continue,
            Some(colon) => {
                let name = String::from_utf8_lossy(&text[..colon]).to_ascii_lowercase();
                let value = String::from_utf8_lossy(&text[colon + 1..])
                    .trim()
                    .to_string();
                headers.push((name, value));
            }
            None => return (headers, &data[line.start..]),
        }
    }
    (headers, &data[data.len()..])
}

/// The length of a header name: printable ASCII but `:` and space,
/// followed by `:`. `None` when the line is no header.
fn name_length(line: &[u8]) -> Option<usize> {
    let colon = line
        .iter()
        .position(|b| !matches!(b, 0x21..=0x39 | 0x3b..=0x7e))?;
    (line[colon] == b':').then_some(colon)
}

/// The first header of that name (Python's `Message.get`).
fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn media_type(value: &str) -> String {
    let media = value.split(';').next().unwrap_or_default().trim();
    if media.matches('/').count() == 1 {
        media.to_ascii_lowercase()
    } else {
        "text/plain".to_string()
    }
}

/// A parameter of a header value: `;`-separated (a `;` inside quotes
/// does not separate), the name case-insensitive, the value unquoted.
fn parameter(value: &str, name: &str) -> Option<String> {
    split_parameters(value)
        .into_iter()
        .skip(1)
        .find_map(|param| {
            let (key, val) = param.split_once('=')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| unquote(val.trim()))
        })
}

fn split_parameters(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => {
                out.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&value[start..]);
    out
}

fn unquote(value: &str) -> String {
    match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) if value.len() > 1 => inner.replace("\\\\", "\\").replace("\\\"", "\""),
        _ => value.to_string(),
    }
}

/// The parts between `--boundary` lines, up to `--boundary--` or the end.
/// Each part loses the one line break before the next delimiter (RFC
/// 2046); the last, unclosed part loses its final line break too, as in
/// Python. No delimiter line at all: no parts.
fn split_parts<'a>(body: &'a [u8], boundary: &str) -> Vec<&'a [u8]> {
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut part_start: Option<usize> = None;
    for line in lines(body) {
        let Some(closing) = delimiter_kind(&body[line.start..line.end], delimiter.as_bytes())
        else {
            continue;
        };
        if let Some(start) = part_start {
            parts.push(strip_line_break(&body[start..line.start]));
        }
        if closing {
            return parts;
        }
        part_start = Some(line.next);
    }
    if let Some(start) = part_start {
        parts.push(strip_line_break(&body[start..]));
    }
    parts
}

/// `Some(false)` for a delimiter line, `Some(true)` for the closing one;
/// trailing blanks are allowed.
fn delimiter_kind(line: &[u8], delimiter: &[u8]) -> Option<bool> {
    let rest = line.strip_prefix(delimiter)?;
    let (closing, rest) = match rest.strip_prefix(b"--") {
        Some(after) => (true, after),
        None => (false, rest),
    };
    rest.iter()
        .all(|b| matches!(b, b' ' | b'\t'))
        .then_some(closing)
}

fn strip_line_break(part: &[u8]) -> &[u8] {
    if let Some(stripped) = part.strip_suffix(b"\r\n") {
        return stripped;
    }
    part.strip_suffix(b"\n")
        .or_else(|| part.strip_suffix(b"\r"))
        .unwrap_or(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(data: &str) -> Vec<(String, String)> {
        leaves(data.as_bytes())
            .unwrap()
            .into_iter()
            .map(|leaf| {
                let body = String::from_utf8(leaf.body.to_vec()).unwrap();
                (leaf.content_type, body)
            })
            .collect()
    }

    fn pair(t: &str, b: &str) -> (String, String) {
        (t.to_string(), b.to_string())
    }

    #[test]
    fn marker_is_found_anywhere_in_the_first_4096_bytes() {
        assert!(declares_mime(b"Content-Type: x\nMIME-Version: 1.0\n"));
        assert!(declares_mime(b"#!/bin/sh\n# mime-VERSION: in a comment\n"));
        let late = format!("{}MIME-Version: 1.0", " ".repeat(SNIFF_LEN));
        assert!(!declares_mime(late.as_bytes()));
        assert!(!declares_mime(
            b"Content-Type: multipart/mixed; boundary=b\n"
        ));
    }

    #[test]
    fn headers_may_run_into_the_first_boundary() {
        let data = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"MB\"\n--MB\nContent-Type: text/x-a\n\nbody\n--MB--\n";
        assert_eq!(types(data), vec![pair("text/x-a", "body")]);
    }

    #[test]
    fn unclosed_multipart_runs_to_the_end() {
        let data = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"//\"\n\n--//\nContent-Type: text/x-a\n\nA\n\n--//\nContent-Type: text/x-b\n\nB\n";
        assert_eq!(
            types(data),
            vec![pair("text/x-a", "A\n"), pair("text/x-b", "B")]
        );
        // A trailing delimiter opens one last, empty part.
        let data =
            "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=b\n\n--b\n\nA\n--b\n";
        assert_eq!(
            types(data),
            vec![pair("text/plain", "A"), pair("text/plain", "")]
        );
    }

    #[test]
    fn nested_multiparts_are_flattened_and_bounded() {
        let inner = "Content-Type: multipart/alternative; boundary=in\n\n--in\nContent-Type: text/x-b\n\nB\n--in--";
        let data = format!(
            "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"out; x\"\r\n\r\n--out; x\r\n\r\nA\r\n--out; x\r\n{inner}\r\n--out; x--\r\n"
        );
        assert_eq!(
            types(&data),
            vec![pair("text/plain", "A"), pair("text/x-b", "B")]
        );
        let mut deep = String::from("MIME-Version: 1.0\n");
        for level in 0..=MAX_DEPTH {
            deep.push_str(&format!(
                "Content-Type: multipart/mixed; boundary=b{level}\n\n--b{level}\n"
            ));
        }
        assert!(matches!(
            leaves(deep.as_bytes()),
            Err(UserDataError::Mime(m)) if m.contains("nested")
        ));
    }

    #[test]
    fn multipart_without_boundary_has_no_parts() {
        assert_eq!(
            types("MIME-Version: 1.0\nContent-Type: multipart/mixed\n\n--b\n\nA\n"),
            vec![]
        );
        assert_eq!(
            types("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=b\n\n--c\n\nA\n"),
            vec![]
        );
    }

    #[test]
    fn header_details_follow_python() {
        let data = "MIME-Version: 1.0\nContent-Type: MULTIPART/Mixed;\n boundary=\"a\\\"b\"\n\n--a\"b  \nContent-Type: bogus\nContent-Type: text/x-second\nContent-Transfer-Encoding: BASE64\n\nQQ==\n--a\"b--\n";
        let parts = leaves(data.as_bytes()).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].content_type, "text/plain");
        assert_eq!(parts[0].encoding.as_deref(), Some("base64"));
    }
}
