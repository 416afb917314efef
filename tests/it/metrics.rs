//! Metrics: the EMF lines the functions write, taken from the real receive and
//! process paths, compared with what AWS's own `aws-embedded-metrics` library
//! writes for the same dimensions and values (so the format is CloudWatch's,
//! not our reading of it).

use std::{
    io::Write,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use inbox_tests::{request, secrets, stripe_header, TestApp, STRIPE};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use webhook_inbox::{
    host::{Metrics, NAMESPACE},
    process,
};

/// The line AWS's library writes for `ours`' dimensions and metrics.
fn reference(ours: &Value) -> Value {
    let aws = &ours["_aws"]["CloudWatchMetrics"][0];
    let dims: serde_json::Map<String, Value> = aws["Dimensions"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d.as_str().unwrap().into(), ours[d.as_str().unwrap()].clone()))
        .collect();
    let metrics: Vec<Value> = aws["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| json!([m["Name"], ours[m["Name"].as_str().unwrap()], m["Unit"]]))
        .collect();
    let spec = json!({"namespace": aws["Namespace"], "dimensions": dims, "metrics": metrics});
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/support/emf_reference.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(spec.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "aws-embedded-metrics is not installed (`pip install aws-embedded-metrics`; scripts/test does): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the library prints one JSON line")
}

/// Order-free (a dimension set is a set to CloudWatch), number-type-free, without the timestamp.
fn normalized(mut doc: Value) -> Value {
    let aws = doc["_aws"].as_object_mut().unwrap();
    let stamp = aws.remove("Timestamp").expect("a Timestamp");
    assert!(stamp.as_u64().is_some_and(|t| t > 1_700_000_000_000), "milliseconds since the epoch: {stamp}");
    let directive = &mut aws.get_mut("CloudWatchMetrics").unwrap()[0];
    for set in directive["Dimensions"].as_array_mut().unwrap() {
        set.as_array_mut().unwrap().sort_by_key(|d| d.as_str().unwrap().to_string());
    }
    let mut metrics = directive["Metrics"].as_array().unwrap().clone();
    metrics.sort_by_key(|m| m["Name"].as_str().unwrap().to_string());
    directive["Metrics"] = Value::Array(metrics);
    for (_, v) in doc.as_object_mut().unwrap().iter_mut() {
        if let Some(n) = v.as_f64() {
            *v = json!(n);
        }
    }
    doc
}

fn assert_as_aws_writes_it(metrics: &Metrics) -> Value {
    let ours = metrics.document(1_800_000_000_000);
    assert_eq!(normalized(ours.clone()), normalized(reference(&ours)), "our line:\n{ours}");
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

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_scheduled_process_run_writes_its_counts_and_the_queue_gauges(_: PgPoolOptions, opts: PgConnectOptions) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    for i in 0..3 {
        let body = format!(r#"{{"id":"evt_g{i}","type":"customer.created","data":{{"object":{{}}}}}}"#);
        app.post("stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], body.as_bytes()))], body.as_bytes()).await;
    }
    sqlx::query("UPDATE webhook_inbox SET received_at = now() - interval '90 seconds' WHERE event_id = 'evt_g0'")
        .execute(&app.pool)
        .await
        .unwrap();
    // Before the run: three pending, the oldest 90 s old.
    let gauges = webhook_inbox::ops::inbox_gauges(&app.pool).await.unwrap();
    assert_eq!(gauges.pending, 3);
    assert!((89_000.0..100_000.0).contains(&gauges.oldest_pending_ms), "{gauges:?}");

    let worker = app.worker(stock::handlers());
    let (result, metrics) =
        process::handle_counted(&worker, json!({"source": "aws.scheduler"}), Instant::now() + Duration::from_secs(30))
            .await;
    result.unwrap();
    let line = assert_as_aws_writes_it(&metrics);
    assert_eq!(line["function"], "process");
    assert_eq!((line["claimed"].as_f64(), line["unhandled"].as_f64()), (Some(3.0), Some(3.0)), "{line}");
    assert_eq!((line["pending"].as_f64(), line["oldest_pending_age"].as_f64()), (Some(0.0), Some(0.0)), "{line}");
    assert_eq!(line["failed_last_hour"].as_f64(), Some(0.0));
    let units: Vec<(&str, &str)> = line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["Name"].as_str().unwrap(), m["Unit"].as_str().unwrap()))
        .collect();
    assert!(units.contains(&("oldest_pending_age", "Milliseconds")) && units.contains(&("claimed", "Count")));
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
