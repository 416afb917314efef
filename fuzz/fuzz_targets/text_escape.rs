//! Stored text as the operator's commands and the logs write it, on arbitrary
//! text: nothing unsafe comes out of `escape`, and `escape_json` of any JSON
//! string reads back to the same string with nothing unsafe left in it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use webhook_inbox_schemes::text::{escape, escape_json, is_unsafe};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let escaped = escape(&text);
    assert!(!escaped.chars().any(is_unsafe), "{text:?} -> {escaped:?}");
    let json = serde_json::to_string_pretty(&serde_json::json!({ "value": text })).unwrap();
    let safe = escape_json(&json);
    assert!(!safe.chars().filter(|c| *c != '\n').any(is_unsafe), "{json:?} -> {safe:?}");
    let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
    assert_eq!(back["value"].as_str(), Some(text.as_ref()));
});
