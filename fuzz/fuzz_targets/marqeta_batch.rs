//! The Marqeta batch splitter on arbitrary bytes: no panic, never more rows than
//! the cap, every row keyed by a usable id, and a pending row's payload usable.
#![no_main]

use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use webhook_inbox_schemes::{
    marqeta::{Marqeta, MAX_BATCH_ITEMS},
    payload,
    secret::{MarqetaAuth, Secret},
    Delivery, Events, InitialStatus, Scheme, MAX_EVENT_ID_CHARS,
};

fuzz_target!(|body: &[u8]| {
    let scheme = Marqeta::new(MarqetaAuth {
        username: Secret::new("fuzz_user"),
        passwords: vec![Secret::new("fuzz-password-never-guessed")],
        signing_secrets: vec![],
    });
    let headers = HeaderMap::new();
    let Events::Batch(rows) = scheme.events(&Delivery { headers: &headers, body, now: 0 }) else {
        panic!("Marqeta deliveries are batches");
    };
    assert!(rows.len() <= MAX_BATCH_ITEMS);
    for row in rows {
        assert!(!row.event_id.is_empty() && row.event_id.chars().count() <= MAX_EVENT_ID_CHARS);
        match row.status {
            InitialStatus::Pending => {
                let text = row.payload.as_deref().expect("a pending row has its payload");
                assert!(payload::check(text).is_ok_and(|c| !c.has_nul) && payload::decode(text).is_ok());
            }
            InitialStatus::Failed => assert!(row.failure_reason.is_some()),
        }
    }
});
