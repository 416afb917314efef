//! Ignore rules (`INBOX_RULES_FILE`): an event a rule matches is claimed,
//! ends `ignored` with no handler run and no attempt spent, stays a
//! duplicate on redelivery, is requeued like `unhandled`; a rule's payload
//! conditions decide per event; `inbox rules check` counts what a file would
//! have ignored; a bad file is refused at start-up, naming the rule.

use std::{
    ops::ControlFlow,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};
use webhook_inbox::{
    config::{Env, IgnoreRules},
    ops::{self, Audit, Filter, Status},
    Event, HandlerError, Handlers, Outcome, Receiver, Worker, WorkerConfig,
};
use webhook_inbox_schemes::Provider;

const RULES: &str = r#"
[[ignore]]
provider = "github"
type = "ping"

[[ignore]]
name = "test-mode charges"
provider = "stripe"
type = "charge.*"
when = [{ pointer = "/livemode", equals = false }]
"#;

/// A handler for `charge.updated` and `ping` that counts its calls.
fn counting(calls: &Arc<AtomicUsize>) -> Handlers {
    let on = |calls: Arc<AtomicUsize>| {
        move |_: &mut PgConnection, _: &Event<Value>| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(Outcome::Applied)
            }
        }
    };
    Handlers::new()
        .on(Provider::STRIPE, "charge.updated", on(calls.clone()))
        .unwrap()
        .on(Provider::GITHUB, "ping", on(calls.clone()))
        .unwrap()
}

fn ruled(pool: &PgPool, handlers: Handlers) -> Worker {
    Worker::new(
        pool.clone(),
        handlers,
        WorkerConfig { rules: IgnoreRules::parse(RULES).unwrap(), ..fast_worker_config() },
    )
}

fn charge(id: &str, livemode: bool) -> Vec<u8> {
    json!({"id": id, "type": "charge.updated", "livemode": livemode, "data": {"object": {"id": format!("ch_{id}")}}})
        .to_string()
        .into_bytes()
}

async fn row(pool: &PgPool, id: &str) -> (String, i32, Option<String>, bool) {
    sqlx::query_as(
        "SELECT status, attempts, failure_reason, processed_at IS NOT NULL FROM webhook_inbox WHERE event_id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_event_a_rule_matches_is_claimed_ends_ignored_and_runs_no_handler(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let app = TestApp::spawn(opts, secrets(false)).await;
    let pool = app.pool.clone();
    let signed = |body: &[u8]| stripe_header(STRIPE[0], body);
    for (id, livemode) in [("evt_test", false), ("evt_live", true)] {
        let body = charge(id, livemode);
        assert_eq!(app.post("stripe", &[("Stripe-Signature", &signed(&body))], &body).await.0, StatusCode::OK);
    }
    store(&pool, Provider::GITHUB, "gh_ping", "ping", r#"{"zen": "Keep it logically awesome."}"#).await;
    store(&pool, Provider::GITHUB, "gh_push", "push", "{}").await;
    // No handler takes it: its payload is read for the rule all the same.
    store(&pool, Provider::STRIPE, "evt_refund", "charge.refunded", r#"{"livemode": false}"#).await;

    let calls = Arc::new(AtomicUsize::new(0));
    let counts = ruled(&pool, counting(&calls)).run_once(later()).await.unwrap();
    assert_eq!((counts.taken, counts.ignored, counts.applied, counts.unhandled), (5, 3, 1, 1));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "only the live charge reached its handler");
    let by_rule = |name: &str| Some(format!("ignored by the rule {name:?} (INBOX_RULES_FILE)"));
    assert_eq!(row(&pool, "evt_test").await, ("ignored".into(), 0, by_rule("test-mode charges"), true));
    assert_eq!(row(&pool, "gh_ping").await, ("ignored".into(), 0, by_rule("#1"), true));
    assert_eq!(row(&pool, "evt_refund").await, ("ignored".into(), 0, by_rule("test-mode charges"), true));
    assert_eq!(row(&pool, "evt_live").await.0, "done");
    assert_eq!(row(&pool, "gh_push").await.0, "unhandled");

    // A redelivery of an ignored event is still a duplicate.
    let again = charge("evt_test", false);
    let answer = app.post("stripe", &[("Stripe-Signature", &signed(&again))], &again).await;
    assert_eq!(answer, (StatusCode::OK, json!({"status": "duplicate"})));

    // Counted apart, as its own status.
    let counts = ops::status_counts(&pool, 1000).await.unwrap();
    assert!(counts.contains(&(Status::Ignored, ops::Count::Exact(3))), "{counts:?}");
}

/// Inline mode runs no handler for an event a rule ignores: it is left
/// pending, and the worker ignores it.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn inline_mode_leaves_an_ignored_event_to_the_worker(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut cfg = config(secrets(false));
    cfg.inline_providers = vec![Provider::STRIPE];
    cfg.rules = IgnoreRules::parse(RULES).unwrap();
    let r = Receiver::connect_with(opts, &cfg).with_handlers(counting(&calls));
    for (id, livemode) in [("evt_test", false), ("evt_live", true)] {
        let body = charge(id, livemode);
        assert_eq!(
            post(&r, "stripe", &[("Stripe-Signature", &stripe_header(STRIPE[0], &body))], &body).await.0,
            StatusCode::OK
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the live charge ran inline");
    assert_eq!((row(&pool, "evt_test").await.0.as_str(), row(&pool, "evt_live").await.0.as_str()), ("pending", "done"));
    assert_eq!(ruled(&pool, counting(&calls)).run_once(later()).await.unwrap().ignored, 1);
    assert_eq!(row(&pool, "evt_test").await.0, "ignored");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Requeued like `unhandled`: with the rule gone (the file changed), the
/// handler runs; with it still there, the event is ignored again.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_ignored_event_requeued_runs_once_the_rule_is_gone(pool: PgPool) {
    store(&pool, Provider::GITHUB, "gh_ping", "ping", "{}").await;
    let calls = Arc::new(AtomicUsize::new(0));
    ruled(&pool, counting(&calls)).run_once(later()).await.unwrap();
    let requeue = |pool: PgPool| async move {
        let filter = Filter { statuses: vec![Status::Ignored], ..Default::default() };
        let by = Audit { actor: "test", action: "requeue", reason: "the rule was a mistake" };
        ops::requeue_all(&pool, &filter, &by, 100, |_| ControlFlow::Continue(())).await.unwrap().requeued
    };
    assert_eq!(requeue(pool.clone()).await, 1);
    assert_eq!(row(&pool, "gh_ping").await, ("pending".into(), 0, None, false));
    assert_eq!(ruled(&pool, counting(&calls)).run_once(later()).await.unwrap().ignored, 1, "the rule still holds");
    assert_eq!(requeue(pool.clone()).await, 1);
    let counts = Worker::new(pool.clone(), counting(&calls), fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((counts.applied, calls.load(Ordering::SeqCst)), (1, 1));
    assert_eq!(row(&pool, "gh_ping").await.0, "done");
}

/// `inbox rules check`: what each rule would have ignored among the stored
/// events, the first rule to match deciding (a shadowed rule ignores none).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_rules_file_tried_on_the_stored_events_counts_each_rule_s_matches(pool: PgPool) {
    for i in 0..12 {
        let body = String::from_utf8(charge(&format!("evt_{i:02}"), i % 3 == 0)).unwrap();
        store(&pool, Provider::STRIPE, &format!("evt_{i:02}"), "charge.updated", &body).await;
    }
    store(&pool, Provider::STRIPE, "evt_pi", "payment_intent.succeeded", r#"{"livemode": false}"#).await;
    store(&pool, Provider::GITHUB, "gh_ping", "ping", "{}").await;
    store(&pool, Provider::SHOPIFY, "sh_1", "orders/paid", "{}").await;
    let text = format!("{RULES}\n[[ignore]]\nname = \"shadowed\"\nprovider = \"stripe\"\ntype = \"charge.updated\"\nwhen = [{{ pointer = \"/livemode\", equals = false }}]\n");
    let rules = IgnoreRules::parse(&text).unwrap();
    let found = ops::rule_matches(&pool, &rules, None).await.unwrap();
    assert_eq!(found.examined, 14, "the rules' providers' events (stripe and github), not shopify's");
    let matched: Vec<(&str, u64, Option<&str>)> =
        found.rules.iter().map(|r| (r.name.as_str(), r.matched, r.example.as_deref())).collect();
    assert_eq!(
        matched,
        [("#1", 1, Some("github gh_ping")), ("test-mode charges", 8, Some("stripe evt_01")), ("shadowed", 0, None)]
    );
    // Nothing was changed by trying.
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM webhook_inbox WHERE status <> 'pending'").await, 0);
    // A window: nothing received in it.
    sqlx::query("UPDATE webhook_inbox SET received_at = now() - interval '2 days'").execute(&pool).await.unwrap();
    let recent = ops::rule_matches(&pool, &rules, Some(std::time::Duration::from_secs(86_400))).await.unwrap();
    assert_eq!((recent.examined, recent.rules[1].matched), (0, 0));
}

/// A bad file stops the worker's start, naming the file, the rule and the key.
#[test]
fn a_rules_file_with_a_bad_pointer_is_refused_at_start_up_naming_it() {
    let dir = std::env::temp_dir().join(format!("inbox-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.toml");
    std::fs::write(&file, RULES.replace("\"/livemode\"", "\"livemode\"")).unwrap();
    let path = file.to_str().unwrap();
    let err = WorkerConfig::read(&Env::from_pairs(&[("INBOX_RULES_FILE", path)])).unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "\"{path}\": [[ignore]] #2 (test-mode charges) when #1: pointer \"livemode\": does not start with '/'"
        )),
        "{err}"
    );
    assert!(err.contains("INBOX_RULES_FILE"), "{err}");
    let missing = dir.join("nowhere.toml");
    let err = WorkerConfig::read(&Env::from_pairs(&[("INBOX_RULES_FILE", missing.to_str().unwrap())])).unwrap_err();
    assert!(err.to_string().contains("cannot read"), "{err}");
    // The same text inline (INBOX_RULES), and a good file read whole.
    let inline = WorkerConfig::read(&Env::from_pairs(&[("INBOX_RULES", RULES)])).unwrap();
    assert_eq!(inline.rules.ignore_rules().len(), 2);
    std::fs::write(&file, RULES).unwrap();
    assert_eq!(WorkerConfig::read(&Env::from_pairs(&[("INBOX_RULES_FILE", path)])).unwrap().rules, inline.rules);
    std::fs::remove_dir_all(&dir).unwrap();
}
