//! The operator's commands, run as a user runs them (the `inbox` binary) against
//! a real database of their own: what they print, what they change, and how
//! they fail.

use std::process::{Command, Output};

use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};

mod actions;
mod requeue;

fn url_of(opts: &PgConnectOptions) -> String {
    format!("postgres://postgres@{}:{}/{}", opts.get_host(), opts.get_port(), opts.get_database().unwrap())
}

fn inbox(url: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inbox"));
    cmd.env_remove("DATABASE_URL").env("RUST_LOG", "warn").args(args);
    if let Some(url) = url {
        cmd.env("DATABASE_URL", url);
    }
    cmd.envs(env.iter().copied()).output().unwrap()
}

/// Runs a command that must succeed; its stdout.
fn ok(url: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = inbox(Some(url), args, env);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "inbox {args:?} failed: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn json_of(url: &str, args: &[&str]) -> Value {
    let text = ok(url, args, &[]);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("inbox {args:?} --json printed no JSON ({e}):\n{text}"))
}

/// Runs a command that must fail; its stderr.
fn fails(url: Option<&str>, args: &[&str]) -> String {
    let out = inbox(url, args, &[]);
    assert!(!out.status.success(), "inbox {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn row(pool: &PgPool, provider: &str, id: &str, status: &str, reason: Option<&str>, age: &str) {
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, failure_reason, raw_body,
                                    secret_index, attempts, received_at, processed_at)
         VALUES ($1, $2, 'x.y', '{}', $3, $4, '{}', 0, CASE WHEN $3 = 'failed' THEN 10 ELSE 0 END,
                 now() - $5::interval, CASE WHEN $3 = 'pending' THEN NULL ELSE now() - $5::interval END)",
    )
    .bind(provider)
    .bind(id)
    .bind(status)
    .bind(reason)
    .bind(age)
    .execute(pool)
    .await
    .unwrap();
}

async fn status(pool: &PgPool, provider: &str, id: &str) -> (String, i32) {
    sqlx::query_as("SELECT status, attempts FROM webhook_inbox WHERE provider = $1 AND event_id = $2")
        .bind(provider)
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn stats_counts_by_provider_and_status_and_names_the_secrets_in_use(
    pool_options: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    row(&pool, "stripe", "evt_1", "pending", None, "2 minutes").await;
    row(&pool, "stripe", "evt_2", "done", None, "1 minute").await;
    row(&pool, "github", "g_1", "failed", Some("malformed"), "10 minutes").await;
    row(&pool, "github", "g_2", "failed", Some("malformed"), "3 hours").await;
    sqlx::query("UPDATE webhook_inbox SET secret_index = 1 WHERE event_id = 'evt_2'").execute(&pool).await.unwrap();
    sqlx::query("INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, dead_at) VALUES ('p', '1', '{}', 'k1', NULL), ('p', '2', '{}', 'k2', now())")
        .execute(&pool).await.unwrap();

    let stats = json_of(&url, &["stats", "--json"]);
    let events = stats["events"].as_array().unwrap();
    assert!(events.contains(&json!({"provider": "github", "status": "failed", "count": 2})), "{stats}");
    assert!(events.contains(&json!({"provider": "stripe", "status": "pending", "count": 1})), "{stats}");
    assert_eq!(stats["inbox"]["pending"], 1);
    assert_eq!(stats["inbox"]["failed_last_hour"], 1, "the one failed 3 hours ago is not counted");
    assert!((115_000.0..200_000.0).contains(&stats["inbox"]["oldest_pending_ms"].as_f64().unwrap()), "{stats}");
    assert_eq!((stats["outbox"]["backlog"].as_i64(), stats["outbox"]["dead"].as_i64()), (Some(1), Some(1)));
    let stripe_secrets: Vec<(i64, i64)> = stats["secrets_last_7_days"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["provider"] == "stripe")
        .map(|s| (s["secret_index"].as_i64().unwrap(), s["deliveries"].as_i64().unwrap()))
        .collect();
    assert_eq!(stripe_secrets, [(1, 1), (0, 1)], "rows stored before fingerprints, by position, the latest first");

    let table = ok(&url, &["stats"], &[]);
    assert!(
        table.contains("provider") && table.contains("github") && table.contains("failed in the last hour: 1"),
        "{table}"
    );
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn failed_lists_reasons_filtered_by_provider_and_time(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    row(&pool, "github", "g_new", "failed", Some("malformed payload: expected value"), "5 minutes").await;
    row(&pool, "github", "g_old", "failed", Some("too old"), "2 days").await;
    row(&pool, "stripe", "evt_f", "failed", Some("attempt 10: handler error"), "1 minute").await;
    row(&pool, "stripe", "evt_ok", "done", None, "1 minute").await;

    let all = json_of(&url, &["failed", "--json"]);
    let ids: Vec<&str> = all.as_array().unwrap().iter().map(|e| e["event_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["evt_f", "g_new", "g_old"], "the most recent first, only failed ones");
    let recent = json_of(&url, &["failed", "--provider", "github", "--since", "1h", "--json"]);
    assert_eq!(recent.as_array().unwrap().len(), 1);
    assert_eq!(recent[0]["failure_reason"], "malformed payload: expected value");
    assert_eq!(json_of(&url, &["failed", "--limit", "1", "--json"]).as_array().unwrap().len(), 1);
    let table = ok(&url, &["failed", "--provider", "stripe"], &[]);
    assert!(table.contains("evt_f") && table.contains("attempt 10: handler error"), "{table}");
    assert!(fails(Some(&url), &["failed", "--since", "last tuesday"]).contains("neither a duration"));
}

/// Rotation statistics credit the secret that verified, by fingerprint,
/// whatever order the list is configured in now: after `new,old` becomes
/// `old,new`, the old secret's deliveries still count for the old secret, and
/// one no longer configured is named so, ready to be retired.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn secret_use_is_counted_by_fingerprint_whatever_the_order_of_the_list(
    pool_options: PgPoolOptions,
    opts: PgConnectOptions,
) {
    use webhook_inbox::config::Secret;
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    let fp = |s: &str| Secret::new(s).fingerprint();
    for (id, secret, index) in
        [("evt_a", "whsec_old", 1), ("evt_b", "whsec_old", 1), ("evt_c", "whsec_new", 0), ("evt_d", "whsec_gone", 0)]
    {
        row(&pool, "stripe", id, "done", None, "1 minute").await;
        sqlx::query("UPDATE webhook_inbox SET secret_fingerprint = $2, secret_index = $3 WHERE event_id = $1")
            .bind(id)
            .bind(fp(secret))
            .bind(index as i16)
            .execute(&pool)
            .await
            .unwrap();
    }
    assert_ne!(fp("whsec_old"), fp("whsec_new"));
    assert!(!fp("whsec_old").contains("whsec"), "a fingerprint shows nothing of the secret");
    for (list, old_at, new_at) in [("whsec_new,whsec_old", 2, 1), ("whsec_old,whsec_new", 1, 2)] {
        let out = inbox(Some(&url), &["stats", "--json"], &[("STRIPE_WEBHOOK_SECRET", list)]);
        let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
        let by_fingerprint = |f: String| {
            stats["secrets_last_7_days"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["secret_fingerprint"] == f.as_str())
                .cloned()
                .unwrap()
        };
        let old = by_fingerprint(fp("whsec_old"));
        assert_eq!(
            (old["deliveries"].as_i64(), old["configured_as"].as_i64()),
            (Some(2), Some(old_at)),
            "{list}: {old}"
        );
        assert_eq!(by_fingerprint(fp("whsec_new"))["configured_as"].as_i64(), Some(new_at), "{list}");
        assert_eq!(by_fingerprint(fp("whsec_gone"))["configured_as"], Value::Null, "{list}");
    }
    let table = ok(&url, &["stats"], &[("STRIPE_WEBHOOK_SECRET", "whsec_new,whsec_old")]);
    assert!(table.contains(&format!("{} (not configured here)", fp("whsec_gone"))), "{table}");
    assert!(table.contains(&format!("{} (#2 here)", fp("whsec_old"))), "{table}");
    assert!(table.contains("`inbox dev` makes its development secrets for itself"), "says why: {table}");
    let providers = inbox(None, &["providers", "--json"], &[("STRIPE_WEBHOOK_SECRET", "whsec_new,whsec_old")]);
    let providers: Value = serde_json::from_slice(&providers.stdout).unwrap();
    assert_eq!(providers[0]["secret_fingerprints"], json!([fp("whsec_new"), fp("whsec_old")]));
}

/// What a stranger can put in stored text (a payload value that reached a
/// handler's error, an id, a header): terminal escapes, a forged line, C1's
/// one-byte CSI, and bidi overrides.
const HOSTILE: &str =
    "user_token \u{1b}[2J\u{1b}]0;pwned\u{7}\r\n2026-12-01 INFO forged\u{9b}31m\u{202e}txt.exe\u{2066}";

fn is_unsafe(c: char) -> bool {
    c != '\n'
        && (c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}'))
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn stored_text_reaches_the_terminal_escaped(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    let id = "mq_\u{202e}1";
    row(&pool, "marqeta", id, "failed", Some(&format!("attempt 1: no account for {HOSTILE}")), "1 minute").await;
    sqlx::query("UPDATE webhook_inbox SET payload = $1, headers = $2, event_type = $3")
        .bind(json!({"user_token": HOSTILE}))
        .bind(json!({"x-note": HOSTILE}))
        .bind(format!("t.\u{202e}{}", "x"))
        .execute(&pool)
        .await
        .unwrap();
    for args in [vec!["failed"], vec!["show", "marqeta", id], vec!["stats"]] {
        let printed = ok(&url, &args, &[]);
        assert!(!printed.chars().any(is_unsafe), "inbox {args:?} printed raw controls:\n{printed:?}");
    }
    let shown = ok(&url, &["show", "marqeta", id], &[]);
    assert!(shown.contains("\\u{1b}[2J") && shown.contains("\\u{202e}"), "escaped, not dropped: {shown}");
    for args in [vec!["failed", "--json"], vec!["show", "marqeta", id, "--json"]] {
        let printed = ok(&url, &args, &[]);
        assert!(!printed.chars().any(is_unsafe), "inbox {args:?} printed raw controls:\n{printed:?}");
        let value: Value = serde_json::from_str(&printed).unwrap();
        let reason = if args[0] == "failed" { &value[0]["failure_reason"] } else { &value["failure_reason"] };
        assert_eq!(
            reason.as_str().unwrap(),
            format!("attempt 1: no account for {HOSTILE}"),
            "the same text, read back"
        );
    }
}

fn stripe_signature(secret: &str, t: i64, body: &str) -> String {
    format!("t={t},v1={}", inbox_tests::stripe_v1(secret, t, body.as_bytes()))
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn show_tells_whether_the_stored_bytes_still_verify(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    let body = r#"{"id":"evt_s","type":"payment_intent.succeeded"}"#;
    let received: i64 = sqlx::query_scalar("SELECT extract(epoch FROM now() - interval '3 days')::bigint")
        .fetch_one(&pool)
        .await
        .unwrap();
    let headers = json!({"stripe-signature": stripe_signature("whsec_new", received - 10, body)});
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, headers, secret_index, received_at)
         VALUES ('stripe', 'evt_s', 'payment_intent.succeeded', $1::jsonb, $2, $3, 1, to_timestamp($4))",
    )
    .bind(body)
    .bind(body.as_bytes())
    .bind(&headers)
    .bind(received as f64)
    .execute(&pool)
    .await
    .unwrap();

    // Three days later, signed 10 s before it arrived: judged as at arrival.
    let rotated = [("STRIPE_WEBHOOK_SECRET", "whsec_newer,whsec_new")];
    let shown = ok(&url, &["show", "stripe", "evt_s"], &rotated);
    assert!(shown.contains("verifies with stripe secret #2"), "{shown}");
    assert!(shown.contains("payment_intent.succeeded") && shown.contains("never requeued"), "{shown}");
    assert!(!shown.contains("whsec_new"), "no secret printed:\n{shown}");
    let retired = ok(&url, &["show", "stripe", "evt_s"], &[("STRIPE_WEBHOOK_SECRET", "whsec_newer")]);
    assert!(retired.contains("DOES NOT VERIFY"), "{retired}");
    let unconfigured = ok(&url, &["show", "stripe", "evt_s"], &[]);
    assert!(unconfigured.contains("no stripe secret is configured"), "{unconfigured}");
    // A delivery `inbox dev` took with its development secret: told so where no secret is configured.
    let dev_body = r#"{"id":"evt_dev","type":"payment_intent.succeeded"}"#;
    let dev_headers = json!({"stripe-signature": stripe_signature("whsec_dev_stripe_secret", received - 10, dev_body)});
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, headers, secret_index, received_at)
         VALUES ('stripe', 'evt_dev', 'payment_intent.succeeded', $1::jsonb, $2, $3, 0, to_timestamp($4))",
    )
    .bind(dev_body)
    .bind(dev_body.as_bytes())
    .bind(&dev_headers)
    .bind(received as f64)
    .execute(&pool)
    .await
    .unwrap();
    let dev = ok(&url, &["show", "stripe", "evt_dev"], &[]);
    assert!(dev.contains("verifies with inbox dev's development stripe secret (none is configured here)"), "{dev}");

    let json: Value = serde_json::from_str(&ok(&url, &["show", "stripe", "evt_s", "--json"], &rotated)).unwrap();
    assert_eq!(json["payload"]["id"], "evt_s");
    assert_eq!(json["raw_body_bytes"], body.len());
    assert!(fails(Some(&url), &["show", "stripe", "evt_missing"])
        .contains("no event \"evt_missing\" from provider \"stripe\""));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn replay_puts_one_event_back_with_an_audit_record(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    row(&pool, "stripe", "evt_r", "failed", Some("handler error"), "1 hour").await;
    let out = ok(&url, &["replay", "stripe", "evt_r", "--reason", "bug 42 fixed"], &[("INBOX_OPERATOR", "alice")]);
    assert!(out.contains("failed -> pending"), "{out}");
    assert_eq!(status(&pool, "stripe", "evt_r").await, ("pending".into(), 0));
    let audit: (String, String, String, String, i32, Option<String>) = sqlx::query_as(
        "SELECT actor, action, reason, from_status, attempts, failure_reason FROM inbox_audit WHERE event_id = 'evt_r'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        audit,
        ("alice".into(), "replay".into(), "bug 42 fixed".into(), "failed".into(), 10, Some("handler error".into()))
    );
    let shown = ok(&url, &["show", "stripe", "evt_r"], &[]);
    assert!(shown.contains("replay by alice: \"bug 42 fixed\" (was failed, 10 attempts, handler error)"), "{shown}");
    assert!(fails(Some(&url), &["replay", "stripe", "evt_r"]).contains("already pending"));
    assert!(fails(Some(&url), &["replay", "stripe", "evt_nope"]).contains("no event"));
}

#[sqlx::test(migrations = false)]
async fn a_missing_unreachable_or_empty_database_is_named(_: PgPoolOptions, opts: PgConnectOptions) {
    assert!(fails(None, &["stats"]).contains("DATABASE_URL is not set"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let nowhere = format!("postgres://postgres:pw-not-shown@127.0.0.1:{port}/inbox");
    let err = fails(Some(&nowhere), &["stats"]);
    assert!(err.contains("cannot reach the database at postgres://127.0.0.1"), "{err}");
    assert!(err.contains("refused"), "the cause, not only that the pool timed out: {err}");
    assert!(!err.contains("pw-not-shown"), "{err}");
    let err = fails(Some(&url_of(&opts)), &["failed"]);
    assert!(err.contains("has no inbox tables: run `inbox migrate` first"), "{err}");
}

/// The mistakes a user trips on, each named for what it is: the variable, the
/// flag, the cause; no backtrace for an ordinary error, no colour in a log
/// that is not a terminal, no "unknown" actor, no 0 for an age that is none.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn configuration_and_input_mistakes_are_named(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    for (database_url, says) in [
        ("x", "DATABASE_URL: is not a URL"),
        ("mysql://root@127.0.0.1:3306/test", "DATABASE_URL: is a mysql: URL, not PostgreSQL's"),
    ] {
        let err = fails(Some(database_url), &["stats"]);
        assert!(err.contains(says), "{database_url}: {err}");
    }
    // One pass is the only mode: no --once needed to get to the configuration.
    let out = inbox(None, &["relay"], &[("DATABASE_URL", url.as_str()), ("RELAY_HTTP_URL", "hooks.example.com/x")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("RELAY_HTTP_URL: is not a URL"), "{err}");

    let out = inbox(Some(&url), &["show", "stripe", "evt_none"], &[("RUST_BACKTRACE", "1")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no event \"evt_none\" from provider \"stripe\""), "{err}");
    assert!(!err.to_lowercase().contains("backtrace"), "an ordinary error is no crash: {err}");

    let err = fails(Some(&url), &["failed", "--since", "2026-13-45 99:99"]);
    assert!(err.contains("--since \"2026-13-45 99:99\" is not a timestamp PostgreSQL reads"), "{err}");

    row(&pool, "stripe", "evt_cased", "failed", Some("r"), "1 minute").await;
    let listed = json_of(&url, &["failed", "--provider", "Stripe", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "--provider Stripe is stripe: {listed}");
    assert!(fails(Some(&url), &["failed", "--provider", "str ipe"]).contains("is not a provider name"));

    let stats = json_of(&url, &["stats", "--json"]);
    assert_eq!(stats["inbox"]["oldest_pending_ms"], Value::Null, "nothing pending: no age, not 0");
    assert_eq!(stats["outbox"]["oldest_backlog_ms"], Value::Null);

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inbox"));
    cmd.args(["replay", "stripe", "evt_cased"]).env("DATABASE_URL", &url).env("RUST_LOG", "info");
    let out = cmd.env_remove("USER").env_remove("LOGNAME").env_remove("INBOX_OPERATOR").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let actor: String = sqlx::query_scalar("SELECT actor FROM inbox_audit").fetch_one(&pool).await.unwrap();
    assert!(actor.starts_with("uid "), "who acted, without USER: {actor}");

    // Logs to a pipe (or a file) carry no colour codes: `migrate` on an empty database logs each migration.
    let test_db = opts.get_database().unwrap();
    let fresh = format!("fresh_{}", &test_db[test_db.len().saturating_sub(24)..]).to_lowercase();
    // A run stopped before its end leaves it behind.
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{fresh}\" WITH (FORCE)")).execute(&pool).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE \"{fresh}\"")).execute(&pool).await.unwrap();
    let fresh_url = format!("postgres://postgres@{}:{}/{fresh}", opts.get_host(), opts.get_port());
    let out = inbox(Some(&fresh_url), &["migrate"], &[("RUST_LOG", "info")]);
    let logs = String::from_utf8_lossy(&out.stderr);
    // A team's database gets the inbox's tables alone; the stock application's only when asked.
    let tables = || async {
        let fresh_pool = PgPool::connect(&fresh_url).await.unwrap();
        let tables = inbox_tests::history::tables(&fresh_pool).await;
        fresh_pool.close().await;
        tables
    };
    let inbox_only = tables().await;
    let stock = inbox(Some(&fresh_url), &["migrate", "--stock"], &[]);
    let with_stock = tables().await;
    sqlx::query(&format!("DROP DATABASE \"{fresh}\"")).execute(&pool).await.unwrap();
    assert!(out.status.success() && logs.contains("migration applied"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "{logs:?}");
    assert!(stock.status.success(), "{}", String::from_utf8_lossy(&stock.stderr));
    assert!(String::from_utf8_lossy(&stock.stdout).contains("and the stock application's"));
    assert!(inbox_only.contains(&"webhook_inbox".to_string()), "{inbox_only:?}");
    let added: Vec<&String> = with_stock.iter().filter(|t| !inbox_only.contains(t)).collect();
    let stock_tables =
        ["account_deposits", "accounts", "orders", "payments", "subscriptions", "webhook_inbox_reference_migrations"];
    assert_eq!(added, stock_tables, "`migrate` made none of them, `migrate --stock` all");
    assert!(inbox_only.iter().all(|t| with_stock.contains(t)));
}

/// Output piped into a reader that stops early (`inbox providers --all | head -1`):
/// the output ends there, and the command with it, without a panic.
#[test]
fn a_reader_that_stops_early_ends_the_output_without_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["providers", "--all"])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before the first line
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("panicked"), "{:?}: {stderr}", out.status);
}

/// `inbox providers`: what has a secret here, the URL to give each (a signed URL as configured),
/// and a providers file's mistake named; no database needed.
#[test]
fn providers_lists_the_configured_ones_with_their_urls() {
    let acme = "[acme]\nsignature = { header = \"X-Acme-Signature\" }\nencoding = \"hex\"\nsigned = \"{body}\"\nredelivery_days = 4\n";
    let env = [
        ("INBOX_PROVIDERS", acme),
        ("ACME_WEBHOOK_SECRET", "a-secret,another"),
        ("TWILIO_WEBHOOK_SECRET", "token"),
        ("TWILIO_WEBHOOK_URL", "https://hooks.example.com/prod/webhooks/twilio"),
        ("STRIPE_WEBHOOK_SECRET", "whsec_x"),
    ];
    let out = inbox(None, &["providers", "--json", "--base-url", "https://hooks.example.com/prod/"], &env);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r["provider"].as_str().unwrap()).collect();
    assert_eq!(names, ["acme", "stripe", "twilio"], "only those with a secret");
    let fingerprints: Vec<String> =
        ["a-secret", "another"].iter().map(|s| webhook_inbox::config::Secret::new(*s).fingerprint()).collect();
    assert_eq!(
        rows[0],
        json!({"provider": "acme", "url": "https://hooks.example.com/prod/webhooks/acme", "secrets": 2,
               "secret_fingerprints": fingerprints,
               "contract": "providers file", "signature": "X-Acme-Signature", "unsigned_identity": [],
               "redelivery_days": 4})
    );
    assert_eq!(rows[2]["url"], "https://hooks.example.com/prod/webhooks/twilio");
    // Per provider, what identifies an event without being signed.
    let out = inbox(None, &["providers", "--all", "--json"], &[]);
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    let unsigned = |name: &str| {
        all.as_array().unwrap().iter().find(|r| r["provider"] == name).unwrap()["unsigned_identity"].clone()
    };
    assert_eq!(unsigned("stripe"), json!([]));
    assert_eq!(
        unsigned("twitch"),
        json!(["Twitch-Eventsub-Message-Type"]),
        "its id is signed; only a type's fallback is not"
    );
    assert_eq!(unsigned("github"), json!(["X-GitHub-Delivery", "X-GitHub-Event"]));
    assert_eq!(unsigned("razorpay"), json!(["X-Razorpay-Event-Id"]));
    assert_eq!(unsigned("woocommerce"), json!(["X-WC-Webhook-ID", "X-WC-Webhook-Topic"]));
    let out = inbox(None, &["providers", "--all"], &[]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("HUBSPOT_WEBHOOK_URL (not set; it is signed)") && table.lines().count() == 28, "{table}");

    let out = inbox(None, &["providers"], &[("INBOX_PROVIDERS", "[acme]\nalias = \"stripe\"\n")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("INBOX_PROVIDERS: acme: alias \"stripe\": only standard and declared providers can be aliased"),
        "{err}"
    );
}

/// `inbox events`: every filter's events, newest first, page after page with
/// the cursor each page ends with, each event once; a made-up cursor and a bad
/// time are refused with what is wrong.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn events_pages_through_what_a_filter_selects(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    for i in 0..130 {
        let status = ["done", "failed", "pending"][i % 3];
        let reason = (status == "failed").then_some("it failed");
        row(&pool, ["stripe", "shopify"][i % 2], &format!("evt_{i:03}"), status, reason, &format!("{} minutes", i / 3))
            .await;
    }
    let expected: Vec<String> = sqlx::query_scalar(
        "SELECT event_id FROM webhook_inbox WHERE provider = 'stripe' AND status IN ('failed', 'pending')
         ORDER BY received_at DESC, provider DESC, event_id DESC",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(expected.len() > 20);
    let (mut seen, mut after) = (Vec::new(), None::<String>);
    loop {
        let mut args = vec!["events", "--provider", "Stripe", "--status", "failed,pending", "--limit", "7", "--json"];
        if let Some(cursor) = &after {
            args.extend(["--after", cursor.as_str()]);
        }
        let page = json_of(&url, &args);
        seen.extend(page["events"].as_array().unwrap().iter().map(|e| e["event_id"].as_str().unwrap().to_string()));
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, expected);
    let table = ok(&url, &["events", "--id-prefix", "evt_12", "--limit", "5"], &[]);
    assert!(table.contains("evt_120") && !table.contains("evt_129"), "the newest five: {table}");
    assert!(table.contains("5 shown; the next page: --after "), "{table}");
    let one = ok(&url, &["events", "--id", "evt_007"], &[]);
    assert!(one.contains("evt_007") && one.contains("1 shown; no more"), "{one}");

    let forged = fails(Some(&url), &["events", "--after", "not-a-cursor"]);
    assert!(forged.contains("not a page cursor of this listing"), "{forged}");
    let bad_time = fails(Some(&url), &["events", "--since", "2026-13-45"]);
    assert!(bad_time.contains("--since \"2026-13-45\" is not a timestamp PostgreSQL reads"), "{bad_time}");
}
