//! Generators of hostile JSON text for property tests: nesting around and far
//! past the 127-level limit, numbers outside `f64`'s range or wider than 64 bits,
//! `\u0000`, lone and paired surrogates, repeated keys, and any Unicode.

use proptest::{collection::vec, prelude::*, sample::select};

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| format!("{f:e}")),
        select(vec![
            "0",
            "-0",
            "1e400",
            "-1e400",
            "1e308",
            "1.7976931348623157e308",
            "1.8e308",
            "1e-400",
            "4.9e-324",
            "123456789012345678901234567890",
            "-9223372036854775809",
            "18446744073709551616",
            "1E+2",
            "0.5e-10",
        ])
        .prop_map(String::from),
    ]
}

fn string() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        any::<String>().prop_map(|s| {
            let quoted = serde_json::to_string(&s).unwrap();
            quoted[1..quoted.len() - 1].to_string()
        }),
        select(vec!["\\ud800", "\\udc00", "\\u0000", "\\\\u0000", "\\ud83d\\ude00", "\\n", "\\\"", "\\/"])
            .prop_map(String::from),
    ];
    vec(part, 0..4).prop_map(|parts| format!("\"{}\"", parts.concat()))
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![select(vec!["\"id\"", "\"type\"", "\"token\"", "\"action\""]).prop_map(String::from), string()]
}

/// Any JSON value, as text.
pub fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![select(vec!["null", "true", "false"]).prop_map(String::from), number(), string()];
    let tree = leaf.prop_recursive(6, 48, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            vec((key(), inner), 0..4).prop_map(|kv| format!(
                "{{{}}}",
                kv.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(",")
            )),
        ]
    });
    prop_oneof![
        4 => tree.clone(),
        1 => (tree, 100usize..160, any::<bool>()).prop_map(|(inner, depth, objects)| {
            if objects {
                format!("{}{inner}{}", "{\"a\":".repeat(depth), "}".repeat(depth))
            } else {
                format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
            }
        }),
    ]
}

/// A Stripe-shaped event around a hostile `data`.
pub fn stripe_event(id: &str, event_type: &str, data: &str) -> String {
    format!(r#"{{"id":"{id}","type":"{event_type}","data":{data}}}"#)
}
