//! Property tests of the one definition of a usable payload: the receive-side
//! check accepts exactly what the worker's decoder accepts, reads the same
//! fields, and finds every `\u0000` (which `jsonb` refuses). No database.

use inbox_tests::hostile_json;
use proptest::prelude::*;
use serde_json::Value;
use webhook_inbox_schemes::payload;

fn contains_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

fn same_verdict(text: &str) -> Result<(), TestCaseError> {
    let checked = payload::check(text);
    let decoded = payload::decode(text);
    prop_assert_eq!(
        checked.is_ok(),
        decoded.is_ok(),
        "check {:?} / decode {:?}",
        checked.as_ref().err(),
        decoded.as_ref().err()
    );
    if let (Ok(c), Ok(v)) = (checked, decoded) {
        // Every NUL the decoded value holds is found (one in a value a repeated key
        // replaced is found too: jsonb's parser refuses it all the same).
        prop_assert!(c.has_nul || !contains_nul(&v));
        let field = |name: &str| v.as_object().and_then(|o| o.get(name)).and_then(Value::as_str).map(String::from);
        prop_assert_eq!(c.fields.id, field("id"));
        prop_assert_eq!(c.fields.kind, field("type"));
        prop_assert_eq!(c.fields.action, field("action"));
        prop_assert_eq!(c.fields.token, field("token"));
    } else {
        // An unusable body still yields its fields when it is JSON at all; never a panic.
        let _ = payload::lenient_fields(text);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn the_check_and_the_decoder_agree_on_hostile_json(text in hostile_json::value()) {
        same_verdict(&text)?;
    }

    #[test]
    fn the_check_and_the_decoder_agree_on_any_text(text in any::<String>()) {
        same_verdict(&text)?;
    }

    #[test]
    fn the_check_and_the_decoder_agree_inside_an_event(data in hostile_json::value()) {
        same_verdict(&hostile_json::stripe_event("evt_p", "prop.test", &data))?;
    }
}
