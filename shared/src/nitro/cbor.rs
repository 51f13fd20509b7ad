//! A small, strict CBOR reader (RFC 8949): enough for attestation documents.
//!
//! Strict where it matters for a signed format: exactly one item and no
//! trailing bytes; a map may not repeat a key (two readers could otherwise
//! pick different values from the same signed bytes); map keys are integers,
//! text or bytes; no floats and no simple values other than false, true,
//! null and undefined; text is UTF-8; indefinite lengths are allowed on
//! strings, arrays and maps (AWS's NitroTPM payloads use an indefinite map)
//! and their chunks must be definite strings of the same type.
//!
//! Bounded: nesting stops at [`MAX_DEPTH`], and no length read from the
//! input allocates before the bytes it promises are known to be there, so a
//! small input can never ask for a large allocation.
//!
//! Byte strings borrow from the input when they are one definite chunk, so
//! the COSE layer signs over exactly the bytes that arrived.

use std::borrow::Cow;
use std::collections::BTreeSet;

/// How deep arrays, maps and tags may nest. A document needs 4 (COSE array,
/// payload map, PCR map or cabundle array, value).
pub const MAX_DEPTH: usize = 16;

/// Why bytes are not the CBOR this reader accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CborError {
    /// The input ends inside an item.
    #[error("truncated at byte {0}")]
    Truncated(usize),
    /// Bytes follow the one item.
    #[error("{0} trailing bytes after the item")]
    Trailing(usize),
    /// Additional information 28..30 (reserved by RFC 8949).
    #[error("reserved additional information {info} at byte {at}")]
    Reserved { info: u8, at: usize },
    /// An indefinite length where none is allowed (integers, tags, chunks).
    #[error("indefinite length not allowed at byte {0}")]
    Indefinite(usize),
    /// A break (0xff) outside an indefinite-length item.
    #[error("unexpected break at byte {0}")]
    UnexpectedBreak(usize),
    /// A chunk of an indefinite string that is not a definite string of its type.
    #[error("bad chunk in an indefinite-length string at byte {0}")]
    BadChunk(usize),
    /// Text that is not UTF-8.
    #[error("text is not UTF-8 at byte {0}")]
    NotUtf8(usize),
    /// A map key repeated.
    #[error("duplicate map key at byte {0}")]
    DuplicateKey(usize),
    /// A map key of a type other than integer, text or bytes.
    #[error("map key of an unsupported type at byte {0}")]
    KeyType(usize),
    /// Floats and unassigned simple values.
    #[error("unsupported simple value or float at byte {0}")]
    Unsupported(usize),
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("nested deeper than {MAX_DEPTH}")]
    TooDeep,
}

/// One decoded item. Negative integers keep CBOR's own form: `Neg(n)` is
/// the value `-1 - n`, so every CBOR integer fits without loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value<'a> {
    /// An unsigned integer (major type 0).
    Uint(u64),
    /// A negative integer `-1 - n` (major type 1).
    Neg(u64),
    /// A byte string (major type 2), borrowed when it was one definite chunk.
    Bytes(Cow<'a, [u8]>),
    /// A text string (major type 3).
    Text(Cow<'a, str>),
    /// An array (major type 4).
    Array(Vec<Value<'a>>),
    /// A map (major type 5), in the order the entries arrived.
    Map(Vec<(Value<'a>, Value<'a>)>),
    /// A tagged item (major type 6).
    Tag(u64, Box<Value<'a>>),
    /// `false` or `true`.
    Bool(bool),
    /// `null`.
    Null,
    /// `undefined`.
    Undefined,
}

impl<'a> Value<'a> {
    /// The entries of a map, or `None`.
    pub fn as_map(&self) -> Option<&[(Value<'a>, Value<'a>)]> {
        match self {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// The elements of an array, or `None`.
    pub fn as_array(&self) -> Option<&[Value<'a>]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The content of a byte string, or `None`.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The content of a text string, or `None`.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(t) => Some(t),
            _ => None,
        }
    }
}

/// Decodes exactly one item that spans all of `input`.
pub fn decode(input: &[u8]) -> Result<Value<'_>, CborError> {
    let mut reader = Reader { input, pos: 0 };
    let value = reader.item(0)?;
    if reader.pos != input.len() {
        return Err(CborError::Trailing(input.len() - reader.pos));
    }
    Ok(value)
}

/// A map key in a form that orders, for the duplicate check.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Key<'k> {
    Int(i128),
    Text(&'k str),
    Bytes(&'k [u8]),
}

impl<'k> Key<'k> {
    fn of(value: &'k Value<'_>) -> Option<Key<'k>> {
        match value {
            Value::Uint(n) => Some(Key::Int(i128::from(*n))),
            Value::Neg(n) => Some(Key::Int(-1 - i128::from(*n))),
            Value::Text(t) => Some(Key::Text(t)),
            Value::Bytes(b) => Some(Key::Bytes(b)),
            _ => None,
        }
    }
}

/// The head of an item: its major type and argument (`None` = indefinite).
struct Head {
    major: u8,
    info: u8,
    arg: Option<u64>,
    at: usize,
}

struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CborError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.input.len())
            .ok_or(CborError::Truncated(self.input.len()))?;
        let bytes = &self.input[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn peek_break(&self) -> bool {
        self.input.get(self.pos) == Some(&0xff)
    }

    fn head(&mut self) -> Result<Head, CborError> {
        let at = self.pos;
        let initial = self.take(1)?[0];
        let (major, info) = (initial >> 5, initial & 0x1f);
        let arg = match info {
            0..=23 => Some(u64::from(info)),
            24..=27 => {
                let bytes = self.take(1 << (info - 24))?;
                Some(bytes.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b)))
            }
            31 => None,
            _ => return Err(CborError::Reserved { info, at }),
        };
        Ok(Head {
            major,
            info,
            arg,
            at,
        })
    }

    /// A length promised by the input, refused before any allocation when
    /// fewer bytes remain than it needs (every item takes at least one).
    fn length(&self, n: u64) -> Result<usize, CborError> {
        let remaining = self.input.len() - self.pos;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= remaining)
            .ok_or(CborError::Truncated(self.input.len()))
    }

    fn item(&mut self, depth: usize) -> Result<Value<'a>, CborError> {
        if depth > MAX_DEPTH {
            return Err(CborError::TooDeep);
        }
        let head = self.head()?;
        match (head.major, head.arg) {
            (0, Some(n)) => Ok(Value::Uint(n)),
            (1, Some(n)) => Ok(Value::Neg(n)),
            (2, _) => self.bytes(&head).map(Value::Bytes),
            (3, _) => self.text(&head).map(Value::Text),
            (4, _) => self.array(&head, depth),
            (5, _) => self.map(&head, depth),
            (6, Some(tag)) => Ok(Value::Tag(tag, Box::new(self.item(depth + 1)?))),
            (7, _) => simple(&head),
            _ => Err(CborError::Indefinite(head.at)),
        }
    }

    fn bytes(&mut self, head: &Head) -> Result<Cow<'a, [u8]>, CborError> {
        match head.arg {
            Some(n) => {
                let n = self.length(n)?;
                Ok(Cow::Borrowed(self.take(n)?))
            }
            None => Ok(Cow::Owned(self.chunks(2)?)),
        }
    }

    fn text(&mut self, head: &Head) -> Result<Cow<'a, str>, CborError> {
        match head.arg {
            Some(n) => {
                let n = self.length(n)?;
                let raw = self.take(n)?;
                std::str::from_utf8(raw)
                    .map(Cow::Borrowed)
                    .map_err(|_| CborError::NotUtf8(head.at))
            }
            None => String::from_utf8(self.chunks(3)?)
                .map(Cow::Owned)
                .map_err(|_| CborError::NotUtf8(head.at)),
        }
    }

    /// The definite chunks of an indefinite string, up to its break. Text
    /// chunks must each be UTF-8 on their own (RFC 8949 §3.2.3).
    fn chunks(&mut self, major: u8) -> Result<Vec<u8>, CborError> {
        let mut out = Vec::new();
        loop {
            if self.peek_break() {
                self.pos += 1;
                return Ok(out);
            }
            let chunk = self.head()?;
            let n = match (chunk.major == major, chunk.arg) {
                (true, Some(n)) => self.length(n)?,
                _ => return Err(CborError::BadChunk(chunk.at)),
            };
            let raw = self.take(n)?;
            if major == 3 && std::str::from_utf8(raw).is_err() {
                return Err(CborError::NotUtf8(chunk.at));
            }
            out.extend_from_slice(raw);
        }
    }

    fn array(&mut self, head: &Head, depth: usize) -> Result<Value<'a>, CborError> {
        let mut items = Vec::new();
        match head.arg {
            Some(n) => {
                for _ in 0..self.length(n)? {
                    items.push(self.item(depth + 1)?);
                }
            }
            None => {
                while !self.peek_break() {
                    items.push(self.item(depth + 1)?);
                }
                self.pos += 1;
            }
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, head: &Head, depth: usize) -> Result<Value<'a>, CborError> {
        let mut entries = Vec::new();
        let count = match head.arg {
            // Each entry takes at least two bytes.
            Some(n) => Some(self.length(n.saturating_mul(2))? / 2),
            None => None,
        };
        loop {
            match count {
                Some(n) if entries.len() == n => break,
                None if self.peek_break() => {
                    self.pos += 1;
                    break;
                }
                _ => {}
            }
            let key_at = self.pos;
            let key = self.item(depth + 1)?;
            if Key::of(&key).is_none() {
                return Err(CborError::KeyType(key_at));
            }
            let value = self.item(depth + 1)?;
            entries.push((key, value));
        }
        refuse_duplicates(&entries, head.at)?;
        Ok(Value::Map(entries))
    }
}

fn refuse_duplicates(entries: &[(Value<'_>, Value<'_>)], at: usize) -> Result<(), CborError> {
    let mut seen = BTreeSet::new();
    for (key, _) in entries {
        if let Some(key) = Key::of(key) {
            if !seen.insert(key) {
                return Err(CborError::DuplicateKey(at));
            }
        }
    }
    Ok(())
}

fn simple<'a>(head: &Head) -> Result<Value<'a>, CborError> {
    match head.info {
        20 => Ok(Value::Bool(false)),
        21 => Ok(Value::Bool(true)),
        22 => Ok(Value::Null),
        23 => Ok(Value::Undefined),
        31 => Err(CborError::UnexpectedBreak(head.at)),
        _ => Err(CborError::Unsupported(head.at)),
    }
}

/// The head of a definite item of `major` type with argument `n`, in the
/// shortest form (RFC 8949 §4.2.1): what the Sig_structure is built from.
pub fn encode_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let major = major << 5;
    // The casts are exact: each branch's range fits its width.
    match n {
        0..=23 => out.push(major | n as u8),
        24..=0xff => out.extend_from_slice(&[major | 24, n as u8]),
        0x100..=0xffff => {
            out.push(major | 25);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(major | 26);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(major | 27);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(bytes: &[u8]) -> CborError {
        decode(bytes).expect_err("refused")
    }

    #[test]
    fn definite_and_indefinite_items_decode_to_the_same_values() {
        // {"a": h'0102'} written definite, then with an indefinite map and
        // an indefinite byte string of two chunks.
        let definite = decode(&[0xa1, 0x61, b'a', 0x42, 1, 2]).unwrap();
        let indefinite = decode(&[0xbf, 0x61, b'a', 0x5f, 0x41, 1, 0x41, 2, 0xff, 0xff]).unwrap();
        assert_eq!(definite, indefinite);
        assert_eq!(
            decode(&[0x9f, 0x01, 0x20, 0xff]).unwrap(),
            Value::Array(vec![Value::Uint(1), Value::Neg(0)])
        );
        assert_eq!(
            decode(&[0x7f, 0x61, b'h', 0x61, b'i', 0xff]).unwrap(),
            Value::Text(Cow::Borrowed("hi"))
        );
    }

    #[test]
    fn one_item_and_nothing_after_it() {
        assert_eq!(err(&[0x01, 0x02]), CborError::Trailing(1));
        assert_eq!(err(&[]), CborError::Truncated(0));
        assert_eq!(err(&[0x82, 0x01]), CborError::Truncated(2));
    }

    #[test]
    fn duplicate_keys_are_refused_whatever_their_encoding() {
        assert_eq!(
            err(&[0xa2, 0x01, 0xf6, 0x01, 0xf6]),
            CborError::DuplicateKey(0)
        );
        // The same key once in one byte, once in a longer head.
        assert_eq!(
            err(&[0xa2, 0x01, 0xf6, 0x18, 0x01, 0xf6]),
            CborError::DuplicateKey(0)
        );
        // Text keys, one of them chunked, in an indefinite map.
        assert_eq!(
            err(&[0xbf, 0x61, b'a', 0x00, 0x7f, 0x61, b'a', 0xff, 0x00, 0xff]),
            CborError::DuplicateKey(0)
        );
        // 1 and -2 are different keys.
        assert!(decode(&[0xa2, 0x01, 0xf6, 0x21, 0xf6]).is_ok());
    }

    #[test]
    fn malformed_shapes_are_refused() {
        assert_eq!(err(&[0x1c]), CborError::Reserved { info: 28, at: 0 });
        assert_eq!(err(&[0x1f]), CborError::Indefinite(0));
        assert_eq!(err(&[0xdf, 0x01]), CborError::Indefinite(0));
        assert_eq!(err(&[0xff]), CborError::UnexpectedBreak(0));
        assert_eq!(err(&[0x5f, 0x61, b'a', 0xff]), CborError::BadChunk(1));
        assert_eq!(err(&[0x5f, 0x5f, 0xff, 0xff]), CborError::BadChunk(1));
        assert_eq!(err(&[0x62, 0xc3, 0x28]), CborError::NotUtf8(0));
        assert_eq!(err(&[0xa1, 0x80, 0x01]), CborError::KeyType(1));
        assert_eq!(err(&[0xf9, 0x3c, 0x00]), CborError::Unsupported(0));
        assert_eq!(err(&[0xf8, 0x20]), CborError::Unsupported(0));
    }

    #[test]
    fn lengths_are_checked_before_allocating() {
        // An array and a string that claim 2^64-1 elements in 9 bytes.
        let mut huge_array = vec![0x9b];
        huge_array.extend_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(err(&huge_array), CborError::Truncated(_)));
        let mut huge_map = vec![0xbb];
        huge_map.extend_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(err(&huge_map), CborError::Truncated(_)));
        let mut huge_bytes = vec![0x5b];
        huge_bytes.extend_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(err(&huge_bytes), CborError::Truncated(_)));
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = vec![0x81; MAX_DEPTH + 2];
        assert_eq!(err(&deep), CborError::TooDeep);
        let mut ok = vec![0x81; MAX_DEPTH];
        ok.push(0x00);
        assert!(decode(&ok).is_ok());
    }

    #[test]
    fn heads_are_written_in_the_shortest_form() {
        for (n, want) in [
            (23u64, vec![0x57]),
            (24, vec![0x58, 24]),
            (256, vec![0x59, 1, 0]),
            (65_536, vec![0x5a, 0, 1, 0, 0]),
            (1 << 32, vec![0x5b, 0, 0, 0, 1, 0, 0, 0, 0]),
        ] {
            let mut out = Vec::new();
            encode_head(&mut out, 2, n);
            assert_eq!(out, want, "{n}");
        }
    }
}
