//! RFC 6901 JSON pointers over the raw text, for ids, types and timestamps.

use std::borrow::Cow;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The value at an RFC 6901 pointer, read without building the tree: each
/// step reads one member (the last of repeated keys, as `jsonb` keeps) or one
/// element, and skips the rest.
pub(super) fn pointer<'a>(text: &'a str, pointer: &str) -> Option<&'a RawValue> {
    if pointer.is_empty() {
        return serde_json::from_str(text).ok();
    }
    let mut here = text;
    let mut value = None;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        let mut de = serde_json::Deserializer::from_str(here);
        let found: &RawValue = match here.trim_start().as_bytes().first()? {
            b'{' => Member(&token).deserialize(&mut de).ok()??,
            b'[' => {
                let i: usize = token.parse().ok().filter(|_| token == "0" || !token.starts_with('0'))?;
                Element(i).deserialize(&mut de).ok()??
            }
            _ => return None,
        };
        de.end().ok()?;
        here = found.get();
        value = Some(found);
    }
    value
}

/// An object's member by key, its other values skipped.
struct Member<'k>(&'k str);

/// An array's element by index, the others skipped.
struct Element(usize);

/// A key, borrowed from the text unless it holds escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> DeserializeSeed<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(Key(key)) = map.next_key()? {
            if key == self.0 {
                found = Some(map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

impl<'de> DeserializeSeed<'de> for Element {
    type Value = Option<&'de RawValue>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Element {
    type Value = Option<&'de RawValue>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        for i in 0.. {
            if i == self.0 {
                found = seq.next_element()?;
                if found.is_none() {
                    break;
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
        }
        Ok(found)
    }
}

/// The body's value at a JSON pointer as text: a string's value, or a
/// number's (or boolean's) digits; nothing for null, objects, arrays and "".
pub fn json_text(body: &[u8], p: &str) -> Option<String> {
    let raw = pointer(std::str::from_utf8(body).ok()?, p)?.get().trim();
    let text = match raw.as_bytes().first()? {
        b'"' => serde_json::from_str::<String>(raw).ok()?,
        b'{' | b'[' | b'n' => return None,
        _ => raw.to_string(),
    };
    (!text.is_empty()).then_some(text)
}
