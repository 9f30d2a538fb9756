//! Python's `json.dumps`, byte for byte, over template values: Hugging Face replaces Jinja's
//! `tojson` with `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, and chat templates print tool schemas and tool-call arguments with it, so
//! the prompt the model sees depends on Python's spacing, escaping and float spelling.

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `json.dumps` keyword arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(unit)`: one item per line, `unit` repeated per level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl DumpOptions {
    /// Python's defaults for the given `indent` and `separators` (`(', ', ': ')` on one line,
    /// `(',', ': ')` with an indent).
    pub fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
        sort_keys: bool,
    ) -> Self {
        let (item_separator, key_separator) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_owned(), ": ".to_owned())
        });
        Self {
            ensure_ascii,
            indent,
            item_separator,
            key_separator,
            sort_keys,
        }
    }
}

/// `json.dumps(value, **options)`.
pub(crate) fn dumps(value: &Value, options: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, options, 0)?;
    Ok(out)
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: object of kind {} is not JSON serializable",
            value.kind()
        ),
    )
}

fn newline_indent(out: &mut String, options: &DumpOptions, level: usize) {
    if let Some(unit) = &options.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(unit);
        }
    }
}

fn write_value(
    out: &mut String,
    value: &Value,
    options: &DumpOptions,
    level: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), options),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline_indent(out, options, level + 1);
                write_value(out, item, options, level + 1)?;
            }
            newline_indent(out, options, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_text(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if options.sort_keys {
                // Python compares str keys by code point, which is byte order in UTF-8.
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline_indent(out, options, level + 1);
                write_string(out, key, options);
                out.push_str(&options.key_separator);
                write_value(out, item, options, level + 1)?;
            }
            newline_indent(out, options, level);
            out.push('}');
        }
        ValueKind::Undefined | ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            return Err(not_serializable(value))
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// A dict key as Python's encoder spells it (`str` as is; `int`, `float`, `bool`, `None`
/// converted; anything else is a `TypeError`).
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            Ok(s)
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "tojson: keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else {
        match f64::try_from(value.clone()) {
            Ok(f) => out.push_str(&python_float_repr(f)),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        }
    }
}

/// Python's `repr(float)` (what `json.dumps` writes): the shortest round-trip digits, in fixed
/// notation when the decimal exponent is in `-4..16`, else `d.ddde±XX`.
pub(crate) fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's `{:e}` is the shortest round-trip representation: "-1.25e-7", "1e16", "0e0".
    let sci = format!("{f:e}");
    let (negative, sci) = match sci.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, sci.as_str()),
    };
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::with_capacity(digits.len() + 8);
    if negative {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.unsigned_abs()
        );
    }
    out
}

fn write_string(out: &mut String, s: &str, options: &DumpOptions) {
    out.reserve(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if options.ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> DumpOptions {
        DumpOptions::new(false, None, None, false)
    }

    #[test]
    fn floats_are_spelled_like_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.234e20, "1.234e+20"),
            (123456.789, "123456.789"),
            (-2.5e-300, "-2.5e-300"),
            (0.30000000000000004, "0.30000000000000004"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(python_float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn default_separators_have_spaces_on_one_line_and_none_before_newlines() {
        let v = Value::from_pairs([("a", Value::from(vec![1, 2])), ("b", Value::from(()))]);
        assert_eq!(dumps(&v, &opts()).unwrap(), r#"{"a": [1, 2], "b": null}"#);
        let indented = DumpOptions::new(false, Some("  ".into()), None, false);
        assert_eq!(
            dumps(&v, &indented).unwrap(),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": null\n}"
        );
    }

    #[test]
    fn empty_containers_stay_on_one_line_with_an_indent() {
        let v = Value::from_pairs([("a", Value::from(Vec::<Value>::new()))]);
        let indented = DumpOptions::new(false, Some("    ".into()), None, false);
        assert_eq!(dumps(&v, &indented).unwrap(), "{\n    \"a\": []\n}");
    }

    #[test]
    fn strings_escape_like_python_with_and_without_ensure_ascii() {
        let v = Value::from("é\"\\\n\u{1}\u{7f}😀");
        assert_eq!(
            dumps(&v, &opts()).unwrap(),
            "\"é\\\"\\\\\\n\\u0001\u{7f}😀\""
        );
        let ascii = DumpOptions::new(true, None, None, false);
        assert_eq!(
            dumps(&v, &ascii).unwrap(),
            "\"\\u00e9\\\"\\\\\\n\\u0001\\u007f\\ud83d\\ude00\""
        );
    }

    #[test]
    fn sort_keys_and_custom_separators() {
        let v = Value::from_pairs([("b", 1), ("a", 2)]);
        let o = DumpOptions::new(false, None, Some((",".into(), ":".into())), true);
        assert_eq!(dumps(&v, &o).unwrap(), r#"{"a":2,"b":1}"#);
    }

    #[test]
    fn undefined_is_not_serializable() {
        assert!(dumps(&Value::UNDEFINED, &opts()).is_err());
    }
}
