//! Log lines that outside data cannot forge.
//!
//! Much of what the server logs comes from outside: an agent's report
//! message, names and errors quoted from requests, CSR subjects in a
//! refusal. Left as they are, a newline in one of them starts what looks
//! like a log line of its own (`… INFO join granted`), an ESC sequence
//! rewrites an operator's terminal and 64 KiB of text buries everything
//! around it. So the formatters here, not the call sites, escape and bound
//! every field value and message of every event and span: no call site can
//! forget.
//!
//! - Text ([`TextFields`]): control characters (C0, DEL, C1), the Unicode
//!   line and paragraph separators and the bidirectional overrides are
//!   written as escapes (`\n`, `\x1b`, `\u{2028}`); string fields are quoted
//!   with `"` and `\` escaped too, so their content cannot pose as other
//!   fields either. Each value is cut at [`FIELD_LIMIT`] bytes, saying how
//!   much was cut.
//! - JSON lines ([`JsonLines`], [`JsonFields`]): serde_json escapes the C0
//!   controls, `"` and `\`; `LineSafe` also escapes C1 controls and
//!   U+2028/U+2029 (valid raw in JSON, but line breaks to readers such as
//!   Python's `str.splitlines`). The same [`FIELD_LIMIT`] applies.

use serde_json::{Map, Value};
use std::fmt::{self, Write as _};
use std::io;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Most bytes of one field value (or message) in a log line. A report's
/// message may be 64 KiB; the first KiB says what went wrong, and the log
/// line stays readable. What is cut is counted in the line.
pub const FIELD_LIMIT: usize = 1024;

/// Whether `c` must not appear raw in a log line: it could end the line
/// (for some reader), drive a terminal, or reorder what is displayed.
fn needs_escape(c: char) -> bool {
    c.is_control() // C0, DEL and C1 (U+0080–U+009F, NEL among them)
        || matches!(c, '\u{2028}' | '\u{2029}') // line and paragraph separators
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') // bidi overrides
}

/// Writes `c` as an escape if it [needs one](needs_escape).
fn write_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x80 => {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// Collects a formatted value, escaped or raw, up to `limit` bytes, and
/// counts the bytes of the original past that (formatting a 64 KiB value
/// never holds more than `limit` of it).
struct Bounded {
    out: String,
    limit: usize,
    /// Escape for text ([`needs_escape`], and `"` `\` when `quoted`);
    /// JSON escapes itself.
    escape: bool,
    quoted: bool,
    cut: usize,
}

impl Bounded {
    fn new(limit: usize, escape: bool, quoted: bool) -> Self {
        Self {
            out: String::new(),
            limit,
            escape,
            quoted,
            cut: 0,
        }
    }

    /// The value, and a note of what was cut if anything was.
    fn finish(mut self) -> String {
        if self.cut > 0 {
            let _ = write!(self.out, "…[{} more bytes cut]", self.cut);
        }
        self.out
    }
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut piece = String::new();
        for c in s.chars() {
            if self.cut > 0 {
                // Once cut, always cut: no later short piece slips in.
                self.cut += c.len_utf8();
                continue;
            }
            piece.clear();
            if self.escape && needs_escape(c) {
                write_escaped(&mut piece, c);
            } else if self.quoted && matches!(c, '"' | '\\') {
                piece.push('\\');
                piece.push(c);
            } else {
                piece.push(c);
            }
            if self.out.len() + piece.len() > self.limit {
                self.cut += c.len_utf8();
            } else {
                self.out.push_str(&piece);
            }
        }
        Ok(())
    }
}

/// `value` escaped for a text log line and cut at [`FIELD_LIMIT`]: what
/// [`TextFields`] writes for a message or an unquoted value.
pub fn escape(value: &dyn fmt::Display) -> String {
    escape_within(value, FIELD_LIMIT)
}

/// Like [`escape`], cut at `limit` bytes (plus the note of what was cut).
pub fn escape_within(value: &dyn fmt::Display, limit: usize) -> String {
    let mut out = Bounded::new(limit, true, false);
    // Bounded never fails; a failing Display impl leaves what it wrote.
    let _ = write!(out, "{value}");
    out.finish()
}

fn bounded(value: &dyn fmt::Display, escape: bool, quoted: bool) -> String {
    let mut out = Bounded::new(FIELD_LIMIT, escape, quoted);
    // Bounded never fails; a failing Display impl leaves what it wrote.
    let _ = write!(out, "{value}");
    out.finish()
}

/// The text format's fields: like tracing-subscriber's default (message
/// bare, then `name=value`, string values quoted), escaped and bounded.
#[derive(Debug, Default, Clone, Copy)]
pub struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = TextVisitor {
            line: String::new(),
        };
        fields.record(&mut visitor);
        writer.write_str(&visitor.line)
    }
}

/// Builds the fields part of one text line.
struct TextVisitor {
    line: String,
}

impl TextVisitor {
    fn push(&mut self, field: &Field, value: String) {
        if !self.line.is_empty() {
            self.line.push(' ');
        }
        let name = field.name();
        if name != "message" {
            self.line.push_str(name.strip_prefix("r#").unwrap_or(name));
            self.line.push('=');
        }
        self.line.push_str(&value);
    }
}

impl Visit for TextVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.push(field, escape(&value));
        } else {
            self.push(field, format!("\"{}\"", bounded(&value, true, true)));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, escape(&value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, escape(&format_args!("{value:?}")));
    }
}

/// The JSON format's span fields: a JSON object, bounded like an event's.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonFields;

impl<'writer> FormatFields<'writer> for JsonFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = JsonVisitor::default();
        fields.record(&mut visitor);
        writer.write_str(&to_json_line(&Value::Object(visitor.fields))?)
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut visitor = JsonVisitor {
            fields: serde_json::from_str(&current.fields).unwrap_or_default(),
        };
        fields.record(&mut visitor);
        current.fields = to_json_line(&Value::Object(visitor.fields))?;
        Ok(())
    }
}

/// Collects fields as JSON values, strings bounded.
#[derive(Default)]
struct JsonVisitor {
    fields: Map<String, Value>,
}

impl JsonVisitor {
    fn insert(&mut self, field: &Field, value: Value) {
        let name = field.name();
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.fields.insert(name.to_string(), value);
    }
}

impl Visit for JsonVisitor {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field, value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.insert(field, bounded(&value, false, false).into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.insert(field, bounded(&value, false, false).into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let value = bounded(&format_args!("{value:?}"), false, false);
        self.insert(field, value.into());
    }
}

/// JSON lines shaped like tracing-subscriber's `json()` (`timestamp`,
/// `level`, `fields`, `target`, `span`, `spans`), bounded and line-safe.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let mut fields = JsonVisitor::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("fields".into(), Value::Object(fields.fields));
        line.insert("target".into(), meta.target().into());
        let spans: Vec<Value> = ctx
            .event_scope()
            .into_iter()
            .flat_map(|scope| scope.from_root())
            .map(|span| {
                let extensions = span.extensions();
                let mut object: Map<String, Value> = extensions
                    .get::<FormattedFields<N>>()
                    .and_then(|f| serde_json::from_str(&f.fields).ok())
                    .unwrap_or_default();
                object.insert("name".into(), span.name().into());
                Value::Object(object)
            })
            .collect();
        if let Some(current) = spans.last() {
            line.insert("span".into(), current.clone());
            line.insert("spans".into(), Value::Array(spans));
        }
        writer.write_str(&to_json_line(&Value::Object(line))?)?;
        writer.write_char('\n')
    }
}

/// `value` as one line of JSON, with [`LineSafe`]'s escapes.
fn to_json_line(value: &Value) -> Result<String, fmt::Error> {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, LineSafe);
    serde::Serialize::serialize(value, &mut serializer).map_err(|_| fmt::Error)?;
    String::from_utf8(out).map_err(|_| fmt::Error)
}

/// serde_json's compact output, also escaping as `\uXXXX` what some
/// line-oriented readers take for a line break or a terminal control: C1
/// controls (NEL), U+2028, U+2029, and the bidi overrides. Still the same
/// JSON value to a JSON parser.
struct LineSafe;

impl serde_json::ser::Formatter for LineSafe {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| needs_escape(c)) {
            writer.write_all(&rest.as_bytes()[..at])?;
            write!(writer, "\\u{:04x}", c as u32)?;
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    /// What a subscriber wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    const FORGED: &str = "boom\n2026-05-01T00:00:00.000000Z  INFO autonode_server::join: \
                          request_id=\"x\" result=\"joined\" join granted\r\x1b[2K\u{2028}\u{85}";

    /// Logs one report-like event through `builder`'s format into a buffer.
    fn log_text(f: impl FnOnce()) -> String {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(TextFields)
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        out.text()
    }

    fn log_json(f: impl FnOnce()) -> String {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(JsonFields)
            .event_format(JsonLines)
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        out.text()
    }

    #[test]
    fn a_forged_line_stays_in_its_own_line_in_text() {
        let text = log_text(|| {
            tracing::info!(agent_message = FORGED, detail = %FORGED, "agent report {}", FORGED);
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
        assert!(
            !text.contains('\u{2028}') && !text.contains('\u{85}'),
            "{text:?}"
        );
        assert!(text.contains("boom\\n2026-05-01"), "{text}");
        assert!(text.contains("\\r\\x1b[2K\\u{2028}\\u{85}"), "{text}");
        // The quoted string cannot close its quotes early.
        assert!(text.contains(r#"agent_message="boom\n2026"#), "{text}");
        assert!(text.contains(r#"request_id=\"x\""#), "{text}");
    }

    #[test]
    fn a_forged_line_stays_in_its_own_line_in_json() {
        let text = log_json(|| {
            tracing::info!(agent_message = FORGED, detail = %FORGED, "agent report");
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        // Python's splitlines would break at these; JSON escapes keep the value.
        assert!(
            !text.contains('\u{2028}') && !text.contains('\u{85}'),
            "{text:?}"
        );
        assert!(
            text.contains("\\u2028") && text.contains("\\u0085"),
            "{text}"
        );
        let line: Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(line["fields"]["agent_message"], FORGED);
        assert_eq!(line["fields"]["detail"], FORGED);
        assert_eq!(line["fields"]["message"], "agent report");
        assert_eq!(line["level"], "INFO");
    }

    #[test]
    fn long_values_are_cut_and_say_so() {
        let long = "a".repeat(64 * 1024);
        let text = log_text(|| tracing::info!(agent_message = %long, "agent report"));
        assert!(text.len() < 2 * FIELD_LIMIT, "{} bytes", text.len());
        assert!(
            text.contains(&format!("…[{} more bytes cut]", 64 * 1024 - FIELD_LIMIT)),
            "{text}"
        );
        let json = log_json(|| tracing::info!(agent_message = long.as_str(), "agent report"));
        let line: Value = serde_json::from_str(json.trim_end()).unwrap();
        let kept = line["fields"]["agent_message"].as_str().unwrap();
        assert!(kept.starts_with(&"a".repeat(FIELD_LIMIT)));
        assert!(kept.ends_with("more bytes cut]"), "{kept}");
    }

    #[test]
    fn escapes_count_toward_the_limit_and_never_split() {
        let cut = escape(&"\n".repeat(FIELD_LIMIT));
        // Each newline is two bytes escaped: half fit.
        assert!(cut.starts_with(&"\\n".repeat(FIELD_LIMIT / 2)));
        assert!(cut.ends_with(&format!("…[{} more bytes cut]", FIELD_LIMIT / 2)));
        let wide = escape(&"é".repeat(FIELD_LIMIT));
        assert!(wide.is_char_boundary(FIELD_LIMIT));
    }

    #[test]
    fn plain_values_read_as_before() {
        let text = log_text(|| {
            tracing::warn!(request_id = "r1", nodeclaim = "default-abc", node = %"ip-10-0-0-1", count = 3, "join refused");
        });
        assert!(
            text.ends_with(
                "join refused request_id=\"r1\" nodeclaim=\"default-abc\" node=ip-10-0-0-1 count=3\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn spans_are_bounded_too() {
        let json = log_json(|| {
            let span = tracing::info_span!("join", request_id = FORGED);
            let _entered = span.enter();
            tracing::info!("inside");
        });
        let line: Value = serde_json::from_str(json.trim_end()).unwrap();
        assert_eq!(line["span"]["request_id"], FORGED);
        assert_eq!(line["span"]["name"], "join");
        let text = log_text(|| {
            let span = tracing::info_span!("join", request_id = %FORGED);
            let _entered = span.enter();
            tracing::info!("inside");
        });
        assert_eq!(text.lines().count(), 1, "{text}");
    }
}
