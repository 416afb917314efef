//! What a usable payload is, decided once for receive, reconcile, inline mode
//! and the worker: JSON that `serde_json::Value` can hold (nesting at most
//! [`MAX_DEPTH`], every number within `f64`'s range, no lone surrogate) and
//! that PostgreSQL's `jsonb` can store (no `\u0000`).
//!
//! Receive checks a body with [`check`], which accepts exactly what [`decode`]
//! accepts (property-tested) but builds nothing, and reads the few top-level
//! fields the schemes need in the same pass. The worker decodes each row on its
//! own with [`decode`], so a row that still cannot be decoded (stored before
//! this check existed, say) fails alone.
//!
//! `jsonb` keeps numbers as exact decimals and prints them in full
//! (`1.7976931348623157e308` comes back as 309 digits), so `serde_json` is built
//! with `float_roundtrip`: correctly rounded parsing gives the same verdict on
//! the text receive checked and on the text the worker reads back (the property
//! test in `tests/hostile.rs` found the difference without it).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// `serde_json`'s recursion limit (128 less one): deeper arrays and objects are unusable.
pub const MAX_DEPTH: usize = 127;

/// Why a payload cannot be used, in words kept as the row's `failure_reason`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(pub String);

/// The payload as handlers see it.
pub fn decode(text: &str) -> Result<serde_json::Value, Unusable> {
    decode_as(text)
}

/// The payload as a handler's own type: unusable JSON as [`decode`] says it,
/// a payload that does not fit the type with serde's message.
pub fn decode_as<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, Unusable> {
    serde_json::from_str(text).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => Unusable(format!("payload does not decode as the handler's type: {e}")),
        _ => Unusable(format!("payload is not usable JSON: {}", describe(&e))),
    })
}

/// Top-level string fields of an object; absent, or not a string, is `None`.
/// A repeated key keeps its last value, as `jsonb` and `Value` do.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields {
    /// `id`.
    pub id: Option<String>,
    /// `type`.
    pub kind: Option<String>,
    /// `action`.
    pub action: Option<String>,
    /// `token` (Marqeta's id).
    pub token: Option<String>,
}

/// A checked body: its fields, and whether it holds `\u0000` (usable JSON that `jsonb` refuses).
#[derive(Debug)]
pub struct Checked {
    /// Its top-level fields.
    pub fields: Fields,
    /// Whether it holds `\u0000`.
    pub has_nul: bool,
}

/// Accepts exactly the texts [`decode`] accepts, without building the tree.
pub fn check(text: &str) -> Result<Checked, Unusable> {
    let Top(fields) =
        serde_json::from_str(text).map_err(|e| Unusable(format!("body is not usable JSON: {}", describe(&e))))?;
    Ok(Checked { fields, has_nul: has_nul_escape(text) })
}

/// Usable, and storable as `jsonb` (no `\u0000`): what a `failed` row may keep as its payload.
pub fn storable(text: &str) -> bool {
    check(text).is_ok_and(|c| !c.has_nul)
}

/// The top-level fields of a body that is JSON but not usable (too deep, a number
/// out of range, a lone surrogate, ...), read without those limits, so that its
/// `failed` row still carries the provider's own id; `Err` when it is not JSON at all.
pub fn lenient_fields(text: &str) -> Result<Fields, String> {
    serde_json::from_str::<Lenient>(text).map(|l| l.0).map_err(|e| format!("body is not JSON: {e}"))
}

/// `serde_json`'s message, with the cases a sender is most likely to hit named plainly.
fn describe(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if text.starts_with("recursion limit exceeded") {
        format!("nested deeper than {MAX_DEPTH} levels ({text})")
    } else {
        text
    }
}

/// Whether valid JSON text holds a `\u0000` escape (a raw NUL byte is not valid JSON):
/// a `\u0000` preceded by an even number of backslashes.
pub fn has_nul_escape(json: &str) -> bool {
    let b = json.as_bytes();
    let mut from = 0;
    while let Some(i) = b[from..].windows(6).position(|w| w == b"\\u0000").map(|i| i + from) {
        let backslashes_before = b[..i].iter().rev().take_while(|c| **c == b'\\').count();
        if backslashes_before % 2 == 0 {
            return true;
        }
        from = i + 1;
    }
    false
}

/// Any JSON value, consumed through `deserialize_any` as `Value` consumes it (so
/// the same depth limit, number ranges and string rules apply), keeping nothing.
struct Any;

impl<'de> Deserialize<'de> for Any {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(AnyVisitor)
    }
}

/// The `visit_*` methods for the scalars a visitor only checks, each answering `$value`.
macro_rules! scalars_give {
    ($ty:ty, $value:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_i64<E>(self, _: i64) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_u64<E>(self, _: u64) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_f64<E>(self, _: f64) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_unit<E>(self) -> Result<$ty, E> {
            Ok($value)
        }
    };
}

struct AnyVisitor;

impl<'de> Visitor<'de> for AnyVisitor {
    type Value = Any;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    scalars_give!(Any, Any);
    fn visit_str<E>(self, _: &str) -> Result<Any, E> {
        Ok(Any)
    }
    fn visit_none<E>(self) -> Result<Any, E> {
        Ok(Any)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Any, D::Error> {
        Any::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Any, A::Error> {
        while seq.next_element::<Any>()?.is_some() {}
        Ok(Any)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Any, A::Error> {
        while map.next_entry::<Any, Any>()?.is_some() {}
        Ok(Any)
    }
}

/// A value that is kept when it is a string, and otherwise only checked.
struct StringOrAny(Option<String>);

impl<'de> Deserialize<'de> for StringOrAny {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StringOrAny;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            scalars_give!(StringOrAny, StringOrAny(None));
            fn visit_str<E>(self, s: &str) -> Result<StringOrAny, E> {
                Ok(StringOrAny(Some(s.to_string())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StringOrAny, A::Error> {
                AnyVisitor.visit_seq(seq).map(|_| StringOrAny(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StringOrAny, A::Error> {
                AnyVisitor.visit_map(map).map(|_| StringOrAny(None))
            }
        }
        d.deserialize_any(V)
    }
}

impl Fields {
    /// Where a top-level key's string goes; `None` for keys nobody reads.
    fn slot(&mut self, key: KeyName) -> Option<&mut Option<String>> {
        match key {
            KeyName::Id => Some(&mut self.id),
            KeyName::Type => Some(&mut self.kind),
            KeyName::Action => Some(&mut self.action),
            KeyName::Token => Some(&mut self.token),
            KeyName::Other => None,
        }
    }
}

/// The whole body: an object's fields are read, anything else only checked.
struct Top(Fields);

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Top;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            scalars_give!(Top, Top(Fields::default()));
            fn visit_str<E>(self, _: &str) -> Result<Top, E> {
                Ok(Top(Fields::default()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Top, A::Error> {
                AnyVisitor.visit_seq(seq).map(|_| Top(Fields::default()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
                let mut fields = Fields::default();
                while let Some(key) = map.next_key::<KeyName>()? {
                    match fields.slot(key) {
                        Some(slot) => *slot = map.next_value::<StringOrAny>()?.0,
                        None => {
                            map.next_value::<Any>()?;
                        }
                    }
                }
                Ok(Top(fields))
            }
        }
        d.deserialize_any(V)
    }
}

/// [`Top`] without the limits: values are skipped as raw text (no depth limit, no
/// number ranges, no surrogate rules); the four fields are read when they are plain strings.
struct Lenient(Fields);

impl<'de> Deserialize<'de> for Lenient {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Lenient;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            scalars_give!(Lenient, Lenient(Fields::default()));
            fn visit_str<E>(self, _: &str) -> Result<Lenient, E> {
                Ok(Lenient(Fields::default()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Lenient, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient(Fields::default()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Lenient, A::Error> {
                let mut fields = Fields::default();
                while let Some(key) = map.next_key::<KeyName>()? {
                    let raw = map.next_value::<Box<RawValue>>()?;
                    if let Some(slot) = fields.slot(key) {
                        *slot = serde_json::from_str::<String>(raw.get()).ok();
                    }
                }
                Ok(Lenient(fields))
            }
        }
        // The values are raw text or `IgnoredAny`, skipped without recursing: only broken
        // syntax (or a lone surrogate in a top-level key) makes this fail.
        d.deserialize_any(V)
    }
}

/// An object key: one of the four read, or any other (checked as a string, kept as nothing).
enum KeyName {
    Id,
    Type,
    Action,
    Token,
    Other,
}

impl<'de> Deserialize<'de> for KeyName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<KeyName, E> {
                Ok(match s {
                    "id" => KeyName::Id,
                    "type" => KeyName::Type,
                    "action" => KeyName::Action,
                    "token" => KeyName::Token,
                    _ => KeyName::Other,
                })
            }
        }
        // `Value` reads keys as strings too (escapes and surrogates checked the same way).
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn check_and_decode_agree_on_the_limits_value_has() {
        for (text, usable) in [
            (nested(MAX_DEPTH), true),
            (nested(MAX_DEPTH + 1), false),
            (format!(r#"{{"id":"e","data":{}}}"#, nested(MAX_DEPTH - 1)), true),
            (format!(r#"{{"id":"e","data":{}}}"#, nested(MAX_DEPTH)), false),
            (r#"{"amount":1e308}"#.into(), true),
            (r#"{"amount":1e400}"#.into(), false),
            (r#"{"amount":-1e400}"#.into(), false),
            (r#"{"amount":123456789012345678901234567890}"#.into(), true),
            (r#"{"amount":1e-400}"#.into(), true),
            (r#"{"x":"\ud800"}"#.into(), false),
            (r#"{"\ud800":1}"#.into(), false),
            (r#"{"x":"\ud83d\ude00"}"#.into(), true),
            (r#"{"id":"a","id":"b"}"#.into(), true),
            ("[1,2]".into(), true),
            (r#""text""#.into(), true),
            (r#"{"id":"evt_1""#.into(), false),
        ] {
            assert_eq!(check(&text).is_ok(), usable, "check: {:.60}", text);
            assert_eq!(decode(&text).is_ok(), usable, "decode: {:.60}", text);
        }
    }

    #[test]
    fn fields_are_read_only_when_they_are_strings_and_the_last_repeat_wins() {
        let c = check(r#"{"id":"evt_1","type":7,"data":{"id":"inner"},"action":"opened","id":"evt_2"}"#).unwrap();
        assert_eq!(
            c.fields,
            Fields { id: Some("evt_2".into()), kind: None, action: Some("opened".into()), token: None }
        );
        assert_eq!(check("[1,2]").unwrap().fields, Fields::default());
    }

    #[test]
    fn deep_nesting_is_named_in_the_reason() {
        let reason = check(&nested(100_000)).unwrap_err().0;
        assert!(reason.contains("nested deeper than 127 levels"), "{reason}");
        assert!(decode(&nested(100_000)).unwrap_err().to_string().contains("nested deeper than 127"));
    }

    #[test]
    fn nul_anywhere_in_json_is_found() {
        assert!(check(r#"{"a":["x\u0000"]}"#).unwrap().has_nul);
        assert!(check(r#"{"a\u0000":1}"#).unwrap().has_nul);
        assert!(!check(r#"{"a":"\\u0000"}"#).unwrap().has_nul, "an escaped backslash is not a NUL");
        assert!(check(r#"{"a":"\\\u0000"}"#).unwrap().has_nul, "a backslash, then a NUL");
    }
}
