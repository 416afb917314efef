//! A stranger's text (payload values, ids, types, failure reasons, header
//! values) made safe for a terminal, a log line and a table, at this one
//! place: every control character (C0, DEL, C1), every bidirectional mark,
//! embedding, override and isolate, and the line and paragraph separators are
//! written as escapes (`\n`, `\r`, `\t`, else `\u{1b}`), so that nothing
//! stored moves the cursor, recolours the screen, forges a log line or
//! reorders what a person reads. Everything else is kept as it is.
//!
//! The operator's commands print every line through [`escape`] and their
//! `--json` through [`escape_json`]; a log field that carries a stranger's
//! text is written [`Escaped`].

use std::{
    borrow::Cow,
    fmt,
    time::{SystemTime, UNIX_EPOCH},
};

use crate::declared::{format_time, TimeFormat};

/// Whether a character is escaped.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}')
        || matches!(c, '\u{2066}'..='\u{2069}')
}

/// The text, every unsafe character escaped; borrowed when there is none.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// JSON text (as `serde_json` writes it, which escapes C0 but not DEL, C1 or
/// the bidirectional controls) with those written as `\uXXXX` too: still the
/// same JSON, read back to the same strings. Such characters can only be
/// inside strings, so each is replaced where it stands.
pub fn escape_json(json: &str) -> Cow<'_, str> {
    if !json.chars().any(is_unsafe) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            // Outside strings, JSON's own whitespace.
            '\n' | '\r' | '\t' => out.push(c),
            c if is_unsafe(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A value displayed escaped, for a log field: `reason = %Escaped(&reason)`.
pub struct Escaped<T>(pub T);

/// PostgreSQL's timestamp text to the second: `2026-12-01 19:10:14.123456+00` as `2026-12-01 19:10:14+00`.
pub fn short_time(t: &str) -> String {
    match t.find('.') {
        Some(dot) => {
            let rest = &t[dot + 1..];
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            format!("{}{}", &t[..dot], &rest[digits..])
        }
        None => t.to_string(),
    }
}

/// `at` in RFC 3339, in UTC, to the microsecond, as PostgreSQL writes a
/// `timestamptz` in JSON and as every time the API and `--json` answer:
/// `2026-12-07T19:03:31.123456+00:00`, the fraction without its trailing
/// zeros, none when the second is whole.
pub fn rfc3339(at: SystemTime) -> String {
    let micros = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
    };
    let (secs, fraction) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    let second = format_time(secs, TimeFormat::Rfc3339);
    let second = second.strip_suffix('Z').unwrap_or(&second);
    match fraction {
        0 => format!("{second}+00:00"),
        f => format!("{second}.{}+00:00", format!("{f:06}").trim_end_matches('0')),
    }
}

/// A TOML file's error on one line: where (line and column), then what, escaped
/// (toml's own display quotes the file's line under it).
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let at = e.span().map_or(String::new(), |span| {
        let before = text.get(..span.start).unwrap_or(text);
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!("line {}, column {column}: ", before.matches('\n').count() + 1)
    });
    format!("{at}{}", escape(e.message().trim_end()))
}

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape(&self.0.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_as_postgresql_writes_them_in_json() {
        use std::time::Duration;
        let at = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(rfc3339(at), "2023-11-14T22:13:20+00:00");
        assert_eq!(rfc3339(at + Duration::from_micros(123_450)), "2023-11-14T22:13:20.12345+00:00");
        assert_eq!(rfc3339(at + Duration::from_nanos(999)), "2023-11-14T22:13:20+00:00", "to the microsecond");
        assert_eq!(rfc3339(UNIX_EPOCH - Duration::from_micros(1)), "1969-12-31T23:59:59.999999+00:00");
    }

    #[test]
    fn controls_and_bidi_are_escaped_and_the_rest_is_kept() {
        let hostile = "tok\u{1b}[2J\u{1b}]0;owned\u{7}\r\nforged line\u{9b}31m \u{202e}gnp.exe\u{2066}x\u{2069}\u{85}";
        let escaped = escape(hostile);
        assert!(!escaped.chars().any(is_unsafe), "{escaped}");
        assert_eq!(
            escaped,
            "tok\\u{1b}[2J\\u{1b}]0;owned\\u{7}\\r\\nforged line\\u{9b}31m \\u{202e}gnp.exe\\u{2066}x\\u{2069}\\u{85}"
        );
        assert!(matches!(escape("évènement 支払い ✓"), Cow::Borrowed(_)), "printable text is kept, unallocated");
    }

    #[test]
    fn escaped_json_reads_back_to_the_same_strings() {
        let value = serde_json::json!({"reason": "a\u{1b}[31m\u{9b}\u{7f}\u{202e}b\u{2028}c\n"});
        let text = serde_json::to_string_pretty(&value).unwrap();
        assert!(text.chars().any(is_unsafe), "serde_json leaves C1, DEL and bidi as they are");
        let escaped = escape_json(&text);
        assert!(!escaped.chars().filter(|c| !matches!(c, '\n')).any(is_unsafe), "{escaped}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&escaped).unwrap(), value);
    }
}
