//! The `process` binary's metrics, driven through a stand-in Lambda Runtime
//! API on a schedule: one EMF line on its stdout with the run's counts and
//! the queue's gauges, compared with what AWS's own `aws-embedded-metrics`
//! library writes for the same dimensions and values.

use std::time::Duration;

use inbox_tests::{
    emf,
    lambda::{answered, database_url, logs, runtime_api, spawn_function},
    secrets, stripe_header, TestApp, STRIPE,
};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

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

    let api = runtime_api("process", json!({"source": "aws.scheduler"})).await;
    let vars = [("DATABASE_URL", database_url(&app.pool))];
    let child = spawn_function(env!("CARGO_BIN_EXE_process"), "process", &api, &vars);
    let done = answered(&api, Duration::from_secs(30)).await;
    let logs = logs(child);
    assert!(done, "no answer; logs:\n{logs}");
    let lines = emf::lines(&logs);
    assert_eq!(lines.len(), 1, "one line per invocation; logs:\n{logs}");
    let line = &lines[0];
    emf::assert_as_aws_writes_it(line);
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
