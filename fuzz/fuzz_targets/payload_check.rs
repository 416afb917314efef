//! The payload check against the worker's decoder, on arbitrary text: the same
//! verdict, the same fields, and the lenient reader never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use webhook_inbox_schemes::payload;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let checked = payload::check(text);
    let decoded = payload::decode(text);
    assert_eq!(checked.is_ok(), decoded.is_ok(), "{text:?}");
    if let (Ok(c), Ok(v)) = (checked, decoded) {
        let field = |name: &str| v.as_object().and_then(|o| o.get(name)).and_then(Value::as_str).map(String::from);
        assert_eq!(c.fields.id, field("id"));
        assert_eq!(c.fields.kind, field("type"));
    } else {
        let _ = payload::lenient_fields(text);
    }
});
