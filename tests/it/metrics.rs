//! Metrics: the EMF lines the functions write, taken from the real receive
//! path, compared with what AWS's own `aws-embedded-metrics` library writes
//! for the same dimensions and values (so the format is CloudWatch's, not our
//! reading of it). The `process` function's line, from its own binary, is
//! checked the same way in `functions/process/tests/metrics.rs`.

use inbox_tests::{emf, request, secrets, stripe_header, TestApp, STRIPE};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use webhook_inbox::host::{Metrics, NAMESPACE};

fn assert_as_aws_writes_it(metrics: &Metrics) -> Value {
    let ours = metrics.document(1_800_000_000_000);
    emf::assert_as_aws_writes_it(&ours);
    ours
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn receive_writes_one_line_per_delivery_as_aws_would(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let body = br#"{"id":"evt_m1","type":"payment_intent.succeeded","data":{"object":{}}}"#;
    let sig = stripe_header(STRIPE[0], body);
    let stale = "t=1,v1=00".to_string();
    let forged = format!("t={},v1=00", now());
    let cases = [
        ("stripe", Some(&sig), "received"),
        ("stripe", Some(&sig), "duplicate"),
        ("stripe", Some(&stale), "rejected_timestamp"),
        ("stripe", Some(&forged), "rejected_signature"),
        ("paypal", None, "rejected_unknown_provider"),
    ];
    for (provider, signature, counted) in cases {
        let headers: Vec<(&str, &str)> = signature.iter().map(|s| ("Stripe-Signature", s.as_str())).collect();
        let (_, metrics) = app.receiver.handle_counted(request(provider, &headers, body)).await;
        let line = assert_as_aws_writes_it(&metrics);
        assert_eq!(line[counted], json!(1.0), "{line}");
        assert_eq!(line["function"], "receive");
        assert_eq!(
            line["provider"],
            if provider == "paypal" { "unknown" } else { "stripe" },
            "never a caller's string"
        );
        assert_eq!(line["_aws"]["CloudWatchMetrics"][0]["Namespace"], NAMESPACE);
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// A relay destination's line: the dimension `destination` beside `function`.
#[test]
fn a_destinations_line_is_as_aws_writes_it() {
    let mut m = Metrics::new("relay").for_destination("billing");
    m.count("relayed", 3).gauge("relay_destination_open", 1.0);
    let line = assert_as_aws_writes_it(&m);
    assert_eq!((line["function"].as_str(), line["destination"].as_str()), (Some("relay"), Some("billing")));
    assert_eq!(line["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([["function", "destination"]]));
}
