//! Alerts with a lifecycle (`[[alert]]`): a failure storm opens one alert and
//! one notification per channel, however long it lasts; its recovery resolves
//! it with one more; it reopens as a new alert if it comes back. The
//! notifications go through the outbox and the relay, to a Slack-shaped
//! endpoint and to a signed one (verified with the Standard Webhooks
//! libraries). Every condition, acknowledging, resolving by hand, evaluations
//! racing from several processes.

use std::time::Duration;

use inbox_tests::later;
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    alerts::{self, AlertRules},
    ops::{self, Audit, PauseScope},
    sinks::{HttpSink, Signer},
    Destination, Relay, RelayConfig, Stage,
};
use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};

use crate::sdk::{sdk, Script};

const STORM: &str = r#"
[[alert]]
name = "payments failing"
condition = "failed"
provider = "stripe"
threshold = 10
window = "5m"
resolve_after = "1s"
notify = [{ destination = "ops-slack", format = "slack" }, { destination = "oncall" }]
"#;

/// `n` stripe events failed now.
async fn failed(pool: &PgPool, from: usize, n: usize) {
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, status, processed_at,
                                    failure_reason, secret_index)
         SELECT 'stripe', 'evt_' || g, 'charge.succeeded', '{}', '\\x7b7d', 'failed', now(), 'boom', 0
         FROM generate_series($1::int, $2::int) AS g",
    )
    .bind(from as i32)
    .bind((from + n - 1) as i32)
    .execute(pool)
    .await
    .unwrap();
}

async fn evaluate(rules: &AlertRules, pool: &PgPool) -> alerts::Evaluated {
    rules.evaluate(pool, Duration::ZERO).await.unwrap()
}

async fn keys(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT message_key FROM transactional_outbox WHERE aggregate_type = 'alert' ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_failure_storm_opens_one_alert_and_its_recovery_resolves_it_each_notified_once(pool: PgPool) {
    let rules = AlertRules::parse(STORM).unwrap();
    failed(&pool, 0, 1000).await;
    let first = evaluate(&rules, &pool).await;
    assert_eq!((first.opened, first.live, first.notifications), (1, 1, 2), "one alert, one message per channel");
    // The storm goes on: the same alert, updated; nothing more sent.
    failed(&pool, 1000, 1000).await;
    for _ in 0..3 {
        let again = evaluate(&rules, &pool).await;
        assert_eq!((again.opened, again.notifications, again.live), (0, 0, 1));
    }
    let alert = &alerts::list(&pool, false, 10).await.unwrap()[0];
    assert_eq!((alert.state.as_str(), alert.scope.as_str(), alert.seen, alert.value), ("open", "stripe", 4, 2000.0));
    assert!(alert.summary.starts_with("2000 events of stripe failed in the last 5 min"), "{}", alert.summary);

    // Recovered: cleared, then resolved once it stayed clear for resolve_after.
    sqlx::query("UPDATE webhook_inbox SET processed_at = now() - interval '1 hour'").execute(&pool).await.unwrap();
    assert_eq!(evaluate(&rules, &pool).await.resolved, 0, "cleared, not yet for resolve_after");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let resolved = evaluate(&rules, &pool).await;
    assert_eq!((resolved.resolved, resolved.notifications, resolved.live), (1, 2, 0));
    assert_eq!(evaluate(&rules, &pool).await.notifications, 0);
    let id = alert.id;
    assert_eq!(
        keys(&pool).await,
        [
            format!("alert:{id}:opened:ops-slack"),
            format!("alert:{id}:opened:oncall"),
            format!("alert:{id}:resolved:ops-slack"),
            format!("alert:{id}:resolved:oncall"),
        ]
    );

    // The relay delivers them: Slack's shape to one, signed JSON to the other.
    let (slack, oncall) = (MockServer::start().await, MockServer::start().await);
    for server in [&slack, &oncall] {
        Mock::given(method("POST")).respond_with(ResponseTemplate::new(200)).mount(server).await;
    }
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let sink = |s: &MockServer| HttpSink::new(s.uri(), Duration::from_secs(10)).unwrap();
    let destinations = vec![
        Destination::new("ops-slack", sink(&slack)),
        Destination::new("oncall", sink(&oncall).signed(Signer::new(secret).unwrap())),
    ];
    let config = RelayConfig { batch_size: 100, retry_base: Duration::from_millis(1), lease: Duration::from_secs(60) };
    assert_eq!(Relay::new(pool.clone(), destinations, config).run(later()).await.unwrap().sent, 4);
    let texts: Vec<String> = slack
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(body.as_object().unwrap().len(), 1, "Slack's shape: {{\"text\": ...}}: {body}");
            body["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(texts.len(), 2);
    assert!(texts[0].contains("*payments failing* opened") && texts[0].contains("1000 events of stripe failed"));
    assert!(texts[0].contains(&format!("`inbox alerts ack {id}`")), "{}", texts[0]);
    assert!(texts[1].contains("*payments failing* resolved") && texts[1].contains("resolved by inbox"), "{}", texts[1]);
    let signed = oncall.received_requests().await.unwrap();
    let types: Vec<Value> =
        signed.iter().map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["type"].clone()).collect();
    assert_eq!(types, [json!("alert.opened"), json!("alert.resolved")]);
    for request in &signed {
        let headers: serde_json::Map<String, Value> = ["webhook-id", "webhook-timestamp", "webhook-signature"]
            .iter()
            .map(|h| (h.to_string(), json!(request.headers[*h].to_str().unwrap())))
            .collect();
        let body = String::from_utf8(request.body.clone()).unwrap();
        for script in [Script::Node, Script::Python] {
            let verified = sdk(
                script,
                json!({"provider": "standard", "op": "verify", "secret": secret, "body": body, "headers": headers}),
            );
            assert_eq!(verified["valid"], true, "{verified}");
        }
    }

    // It comes back: a new alert, notified as such.
    failed(&pool, 5000, 10).await;
    let back = evaluate(&rules, &pool).await;
    assert_eq!((back.opened, back.notifications), (1, 2));
    let live = alerts::list(&pool, false, 10).await.unwrap();
    assert_ne!(live[0].id, id, "a new alert, not the resolved one reopened");
}

/// Acknowledged: no more reminders, still resolves by itself; resolved by
/// hand: audited and notified, and reopened as a new alert if it still holds.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_alert_is_reminded_until_acknowledged_and_resolved_by_hand_is_audited(pool: PgPool) {
    let rules = AlertRules::parse(
        r#"
[[alert]]
condition = "dead_outbox"
remind_every = "1s"
notify = [{ destination = "oncall" }]
"#,
    )
    .unwrap();
    sqlx::query(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, destination, dead_at, last_error)
         VALUES ('p', '1', '{}', 'b-1', 'billing', now(), 'HTTP 400')",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(evaluate(&rules, &pool).await.opened, 1);
    let id = alerts::list(&pool, false, 10).await.unwrap()[0].id;
    assert_eq!(evaluate(&rules, &pool).await.reminded, 0, "not yet");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(evaluate(&rules, &pool).await.reminded, 1);
    let by = Audit { actor: "dana", action: "acknowledge_alert", reason: "on it" };
    assert!(alerts::acknowledge(&pool, id, &by).await.unwrap());
    assert!(!alerts::acknowledge(&pool, id, &by).await.unwrap(), "acknowledged already");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(evaluate(&rules, &pool).await.reminded, 0, "acknowledged: no reminder");

    let by = Audit { actor: "dana", action: "resolve_alert", reason: "billing fixed, retrying by hand" };
    assert!(alerts::resolve(&pool, id, &by).await.unwrap());
    assert!(!alerts::resolve(&pool, id, &by).await.unwrap(), "resolved already");
    let audit: Vec<(String, String, String)> =
        sqlx::query_as("SELECT action, actor, from_status FROM inbox_audit WHERE alert_id = $1 ORDER BY id")
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        audit,
        [
            ("acknowledge_alert".into(), "dana".into(), "open".into()),
            ("resolve_alert".into(), "dana".into(), "acknowledged".into())
        ]
    );
    assert_eq!(
        keys(&pool).await,
        [
            format!("alert:{id}:opened:oncall"),
            format!("alert:{id}:reminder:1:oncall"),
            format!("alert:{id}:resolved:oncall")
        ]
    );
    let reopened = evaluate(&rules, &pool).await;
    assert_eq!(reopened.opened, 1, "the dead message is still there: a new alert");
}

/// Each condition holds where it should, one alert per scope, and clears.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn each_condition_opens_an_alert_per_scope(pool: PgPool) {
    let rules = AlertRules::parse(
        r#"
[[alert]]
condition = "rejected_signatures"

[[alert]]
condition = "oldest_pending"
older_than = "10m"

[[alert]]
condition = "circuit_open"

[[alert]]
condition = "pause_overdue"

[[alert]]
condition = "failed"
threshold = 2
"#,
    )
    .unwrap();
    assert_eq!(evaluate(&rules, &pool).await.opened, 0, "an empty inbox: nothing holds");
    for sql in [
        "INSERT INTO inbox_receive_minutes (provider, minute, rejected) VALUES ('github', date_trunc('minute', now()), 7),
                ('shopify', date_trunc('minute', now()), 2), ('stripe', now() - interval '1 hour', 50)",
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index, received_at)
         VALUES ('shopify', 'old', 'orders/paid', '{}', '\\x7b7d', 0, now() - interval '11 minutes')",
        "INSERT INTO relay_destinations (name, opened_at, failures, last_error)
         VALUES ('billing', now(), 10, 'HTTP 503: <script>')",
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index, status, processed_at,
                                    failure_reason)
         SELECT p, id, 'push', '{}', '\\x7b7d', 0, 'failed', now(), 'boom'
         FROM (VALUES ('github', 'f1'), ('github', 'f2'), ('marqeta', 'f3')) AS f (p, id)",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    let by = Audit { actor: "dana", action: "pause", reason: "migration" };
    ops::pause_events(&pool, &PauseScope::new("shopify", Some("orders/paid")).unwrap(), Duration::from_secs(60), &by)
        .await
        .unwrap();
    sqlx::query("UPDATE inbox_pauses SET paused_at = now() - interval '2 minutes'").execute(&pool).await.unwrap();
    // The worker held the old event (as its next pass would).
    sqlx::query("UPDATE webhook_inbox SET held_by = (SELECT id FROM inbox_pauses) WHERE event_id = 'old'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(evaluate(&rules, &pool).await.opened, 4);
    let mut live: Vec<(String, String)> =
        alerts::list(&pool, false, 10).await.unwrap().into_iter().map(|a| (a.rule, a.scope)).collect();
    live.sort();
    assert_eq!(
        live,
        [
            ("circuit_open".into(), "billing".into()),
            ("failed".into(), "github".into()),
            ("pause_overdue".into(), "shopify orders/paid".into()),
            ("rejected_signatures".into(), "github".into()),
        ],
        "oldest_pending: the old event is held by the pause, so it does not hold"
    );
    sqlx::query("UPDATE webhook_inbox SET held_by = NULL").execute(&pool).await.unwrap();
    assert_eq!(evaluate(&rules, &pool).await.opened, 1, "released, the old event is the oldest pending");
}

/// Several processes evaluate at once (serve replicas, Lambda invocations):
/// one evaluation a minute goes ahead, one alert opens, one notification.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn evaluations_racing_from_many_processes_open_one_alert(pool: PgPool) {
    let rules = AlertRules::parse(STORM).unwrap();
    failed(&pool, 0, 50).await;
    let runs: Vec<_> = (0..8)
        .map(|_| {
            let (rules, pool) = (rules.clone(), pool.clone());
            tokio::spawn(async move { rules.evaluate(&pool, alerts::EVERY).await.unwrap() })
        })
        .collect();
    let mut ran = 0;
    for run in runs {
        ran += usize::from(run.await.unwrap().ran);
    }
    assert_eq!(ran, 1, "one evaluation in the minute");
    assert_eq!(keys(&pool).await.len(), 2);
    assert!(!rules.evaluate(&pool, alerts::EVERY).await.unwrap().ran, "not again within the minute");
}

/// An evaluation with another file (a deploy under way, `inbox alerts
/// evaluate` with rules of its own) leaves the alerts of rules it does not
/// have as they are.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_evaluation_leaves_the_alerts_of_rules_it_does_not_have(pool: PgPool) {
    failed(&pool, 0, 20).await;
    assert_eq!(evaluate(&AlertRules::parse(STORM).unwrap(), &pool).await.opened, 1);
    let other = AlertRules::parse("[[alert]]\ncondition = \"dead_outbox\"").unwrap();
    let e = evaluate(&other, &pool).await;
    assert_eq!((e.opened, e.resolved), (0, 0));
    assert_eq!(alerts::list(&pool, false, 10).await.unwrap()[0].state, "open");
}
