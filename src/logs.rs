//! Log output: env_logger with one formatter for both formats, so a field has one name in each.
//!
//! * Text (default): `[<time> <LEVEL> <target>] <message> key=value …` — env_logger's layout.
//!   A value with a space or a quote is written as a JSON string; a missing one as `-`.
//! * JSON (`--log-json`): one object per line with the stable keys `timestamp`, `level`,
//!   `target`, `message`, then each key-value of the record (the access line's fields) as its
//!   own key: numbers as numbers, a missing value as `null`.
//!
//! Records carry their fields as `log` key-values (`log::info!(target: "t", key = v; "msg")`),
//! never pre-formatted into the message, so the JSON output needs no second parse.

use std::io::Write as _;

use log::kv::{self, VisitSource, VisitValue};
use log::{LevelFilter, Record};

/// Installs the process logger. `RUST_LOG`, when given, wins over `level`.
pub fn init(level: LevelFilter, rust_log: Option<&str>, json: bool) {
    let mut builder = env_logger::Builder::new();
    builder.filter_level(level);
    if let Some(spec) = rust_log {
        builder.parse_filters(spec);
    }
    if json {
        builder.format(|buf, record| {
            let line = json_line(&buf.timestamp_millis().to_string(), record);
            buf.write_all(&line)
        });
    } else {
        builder.format(|buf, record| {
            let style = buf.default_level_style(record.level());
            write!(
                buf,
                "[{} {style}{:<5}{style:#} {}] {}",
                buf.timestamp_millis(),
                record.level(),
                record.target(),
                record.args(),
            )?;
            write_text_fields(buf, record)?;
            writeln!(buf)
        });
    }
    let _ = builder.try_init();
}

/// ` key=value` for each key-value of the record, written straight to the log line (a leading
/// space only when a message precedes; no per-line buffer).
fn write_text_fields(out: &mut dyn std::io::Write, record: &Record<'_>) -> std::io::Result<()> {
    struct Text<'a> {
        out: &'a mut dyn std::io::Write,
        space: bool,
    }
    impl<'kvs> VisitSource<'kvs> for Text<'_> {
        fn visit_pair(
            &mut self,
            key: kv::Key<'kvs>,
            value: kv::Value<'kvs>,
        ) -> Result<(), kv::Error> {
            let sep = if self.space { " " } else { "" };
            self.space = true;
            write!(self.out, "{sep}{}=", key.as_str())?;
            value.visit(TextValue(&mut *self.out))
        }
    }
    let mut v = Text {
        out,
        space: record.args().as_str() != Some(""),
    };
    record
        .key_values()
        .visit(&mut v)
        .map_err(|e| std::io::Error::other(e.to_string()))
}

struct TextValue<'a>(&'a mut dyn std::io::Write);

impl<'v> VisitValue<'v> for TextValue<'_> {
    fn visit_any(&mut self, value: kv::Value) -> Result<(), kv::Error> {
        Ok(write!(self.0, "{value}")?)
    }
    fn visit_null(&mut self) -> Result<(), kv::Error> {
        Ok(self.0.write_all(b"-")?)
    }
    fn visit_u64(&mut self, value: u64) -> Result<(), kv::Error> {
        Ok(write!(self.0, "{value}")?)
    }
    fn visit_i64(&mut self, value: i64) -> Result<(), kv::Error> {
        Ok(write!(self.0, "{value}")?)
    }
    fn visit_bool(&mut self, value: bool) -> Result<(), kv::Error> {
        Ok(write!(self.0, "{value}")?)
    }
    fn visit_str(&mut self, value: &str) -> Result<(), kv::Error> {
        if value.is_empty() || value.contains([' ', '"', '\n', '\t']) {
            let mut quoted = Vec::with_capacity(value.len() + 2);
            pdgate_filters::json::push_string(&mut quoted, value);
            self.0.write_all(&quoted)?;
        } else {
            self.0.write_all(value.as_bytes())?;
        }
        Ok(())
    }
    fn visit_f64(&mut self, value: f64) -> Result<(), kv::Error> {
        Ok(write!(self.0, "{value:.1}")?)
    }
}

/// One JSON object and its newline.
fn json_line(timestamp: &str, record: &Record<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"timestamp\":");
    pdgate_filters::json::push_string(&mut out, timestamp);
    out.extend_from_slice(b",\"level\":");
    pdgate_filters::json::push_string(&mut out, record.level().as_str());
    out.extend_from_slice(b",\"target\":");
    pdgate_filters::json::push_string(&mut out, record.target());
    out.extend_from_slice(b",\"message\":");
    match record.args().as_str() {
        Some(s) => pdgate_filters::json::push_string(&mut out, s),
        None => pdgate_filters::json::push_string(&mut out, &record.args().to_string()),
    }
    struct Json<'a>(&'a mut Vec<u8>);
    impl<'kvs> VisitSource<'kvs> for Json<'_> {
        fn visit_pair(
            &mut self,
            key: kv::Key<'kvs>,
            value: kv::Value<'kvs>,
        ) -> Result<(), kv::Error> {
            self.0.push(b',');
            pdgate_filters::json::push_string(self.0, key.as_str());
            self.0.push(b':');
            value.visit(JsonValue(self.0))
        }
    }
    let _ = record.key_values().visit(&mut Json(&mut out));
    out.extend_from_slice(b"}\n");
    out
}

struct JsonValue<'a>(&'a mut Vec<u8>);

impl<'v> VisitValue<'v> for JsonValue<'_> {
    fn visit_any(&mut self, value: kv::Value) -> Result<(), kv::Error> {
        pdgate_filters::json::push_string(self.0, &value.to_string());
        Ok(())
    }
    fn visit_null(&mut self) -> Result<(), kv::Error> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }
    fn visit_u64(&mut self, value: u64) -> Result<(), kv::Error> {
        let _ = write!(self.0, "{value}");
        Ok(())
    }
    fn visit_i64(&mut self, value: i64) -> Result<(), kv::Error> {
        let _ = write!(self.0, "{value}");
        Ok(())
    }
    fn visit_f64(&mut self, value: f64) -> Result<(), kv::Error> {
        if value.is_finite() {
            let _ = write!(self.0, "{value:.1}");
        } else {
            self.0.extend_from_slice(b"null");
        }
        Ok(())
    }
    fn visit_bool(&mut self, value: bool) -> Result<(), kv::Error> {
        self.0
            .extend_from_slice(if value { b"true" } else { b"false" });
        Ok(())
    }
    fn visit_str(&mut self, value: &str) -> Result<(), kv::Error> {
        pdgate_filters::json::push_string(self.0, value);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_record<R>(f: impl FnOnce(&Record<'_>) -> R) -> R {
        let kvs: [(&str, kv::Value); 5] = [
            ("request_id", kv::Value::from("r-1")),
            ("status", kv::Value::from(200u16)),
            ("room", kv::Value::null()),
            ("duration_ms", kv::Value::from(1.26f64)),
            ("failure", kv::Value::from("upstream \"closed\"")),
        ];
        let args = format_args!("");
        let record = Record::builder()
            .args(args)
            .level(log::Level::Info)
            .target("pdgate::access")
            .key_values(&kvs)
            .build();
        f(&record)
    }

    #[test]
    fn text_fields_follow_the_message_as_key_value_pairs() {
        let text = with_record(|r| {
            let mut out = Vec::new();
            write_text_fields(&mut out, r).unwrap();
            String::from_utf8(out).unwrap()
        });
        assert_eq!(
            text,
            r#"request_id=r-1 status=200 room=- duration_ms=1.3 failure="upstream \"closed\"""#
        );
    }

    #[test]
    fn json_lines_are_one_object_with_typed_fields() {
        let line = with_record(|r| json_line("2026-12-01T00:00:00.000Z", r));
        assert!(line.ends_with(b"}\n"));
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "pdgate::access");
        assert_eq!(v["message"], "");
        assert_eq!(v["request_id"], "r-1");
        assert_eq!(v["status"], 200);
        assert_eq!(v["room"], serde_json::Value::Null);
        assert_eq!(v["duration_ms"], 1.3);
        assert_eq!(v["failure"], "upstream \"closed\"");
    }
}
