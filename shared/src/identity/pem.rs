//! Just enough PEM (RFC 7468) for certificates and PKCS#7 armour.
//!
//! Written here rather than pulled in: it is a few lines over `base64`, and
//! a strict reader (matching labels, standard alphabet, padding) is what we
//! want for trust anchors.

use base64::Engine as _;

/// One `-----BEGIN <label>-----` … `-----END <label>-----` block.
pub(crate) struct Block {
    pub(crate) label: String,
    pub(crate) der: Vec<u8>,
}

/// Every PEM block in `text`, in order. Text outside blocks is ignored
/// (certificate bundles often carry comments).
pub(crate) fn blocks(text: &str) -> Result<Vec<Block>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + "-----BEGIN ".len()..];
        let label_end = after.find("-----").ok_or("unterminated BEGIN line")?;
        let label = &after[..label_end];
        let body_start = &after[label_end + "-----".len()..];
        let end_line = format!("-----END {label}-----");
        let body_end = body_start
            .find(&end_line)
            .ok_or_else(|| format!("no END line for {label}"))?;
        let der = decode_base64_lines(&body_start[..body_end])?;
        out.push(Block {
            label: label.to_owned(),
            der,
        });
        rest = &body_start[body_end + end_line.len()..];
    }
    Ok(out)
}

/// Decode base64 that may be split over lines (IMDS uses 76 columns, PEM
/// 64): all ASCII whitespace is dropped, the rest must be strict base64.
pub(crate) fn decode_base64_lines(text: &str) -> Result<Vec<u8>, String> {
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_blocks_and_ignores_text_between() {
        let text = "comment\n-----BEGIN A-----\nAAEC\n-----END A-----\nx\n-----BEGIN B-----\nAw==\n-----END B-----\n";
        let got = blocks(text).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].label.as_str(), got[0].der.as_slice()),
            ("A", &[0, 1, 2][..])
        );
        assert_eq!(
            (got[1].label.as_str(), got[1].der.as_slice()),
            ("B", &[3][..])
        );
    }

    #[test]
    fn refuses_mismatched_end_and_bad_base64() {
        assert!(blocks("-----BEGIN A-----\nAAEC\n-----END B-----\n").is_err());
        assert!(blocks("-----BEGIN A-----\nA!EC\n-----END A-----\n").is_err());
        assert!(blocks("-----BEGIN A").is_err());
    }
}
