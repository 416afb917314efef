//! What the operator acts on from the command line: the outbox and its
//! destinations, pauses, alerts, erasure, prune's archive and restore.

use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::{fails, inbox, json_of, ok, row, url_of};

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn outbox_lists_dead_letters_and_retries_them(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    sqlx::query(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, attempts, dead_at, last_error, processed_at)
         VALUES ('p', '1', '{}', 'dead-1', 10, now(), 'HTTP 400: bad', NULL),
                ('p', '2', '{}', 'dead-2', 3, now(), 'HTTP 410', NULL),
                ('p', '3', '{}', 'waiting', 1, NULL, NULL, NULL),
                ('p', '4', '{}', 'sent', 1, NULL, NULL, now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let dead = json_of(&url, &["outbox", "--dead", "--json"]);
    let keys: Vec<&str> = dead.as_array().unwrap().iter().map(|m| m["message_key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["dead-1", "dead-2"]);
    assert_eq!(dead[0]["last_error"], "HTTP 400: bad");
    let waiting = json_of(&url, &["outbox", "--json"]);
    assert_eq!(waiting.as_array().unwrap().len(), 1);

    let first = dead[0]["id"].as_i64().unwrap().to_string();
    assert_eq!(json_of(&url, &["outbox", "retry", &first, "--json"]), json!({"retried": 1}));
    assert_eq!(json_of(&url, &["outbox", "--dead", "--json"]).as_array().unwrap().len(), 1);
    assert_eq!(json_of(&url, &["outbox", "retry", "--dead", "--json"]), json!({"retried": 1}));
    let due: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM transactional_outbox WHERE dead_at IS NULL AND processed_at IS NULL AND attempts = 0",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(due, 2, "both dead letters are due again, attempts reset");
    let sent: i64 = sqlx::query_scalar("SELECT id FROM transactional_outbox WHERE message_key = 'sent'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(fails(Some(&url), &["outbox", "retry", &sent.to_string()]).contains("no unsent outbox message"));
}

/// `inbox outbox pause|resume NAME` and `inbox outbox destinations`: a
/// destination's state, backlog and why, audited; a hostile name is refused
/// and a stranger's text is escaped.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn outbox_pauses_resumes_and_lists_destinations(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    sqlx::query(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, destination, dead_at, last_error)
         VALUES ('p', '1', '{}', 'b-1', 'billing', NULL, NULL), ('p', '2', '{}', 'b-2', 'billing', now(), 'HTTP 400'),
                ('p', '3', '{}', 'e-1', 'email', NULL, NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO relay_destinations (name, target, seen_at, opened_at, failures, last_error)
                 VALUES ('email', 'http https://mail.example/', now(), now(), 10, E'HTTP 503: \x1b[31mdown')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let env = [("INBOX_OPERATOR", "carol")];
    let paused = ok(&url, &["outbox", "pause", "billing", "--reason", "billing deploys"], &env);
    assert!(paused.contains("billing paused"), "{paused}");
    assert!(ok(&url, &["outbox", "pause", "billing", "--reason", "again"], &env).contains("paused already"));
    let listed = json_of(&url, &["outbox", "destinations", "--json"]);
    let by_name = |n: &str| listed.as_array().unwrap().iter().find(|d| d["name"] == n).unwrap().clone();
    let billing = by_name("billing");
    assert_eq!(
        (billing["paused_by"].as_str(), billing["backlog"].as_i64(), billing["dead"].as_i64()),
        (Some("carol"), Some(1), Some(1))
    );
    assert_eq!(by_name("email")["failures"], 10);
    let table = ok(&url, &["outbox", "destinations"], &[]);
    assert!(table.contains("paused") && table.contains("billing deploys") && table.contains("open"), "{table}");
    assert!(!table.contains('\x1b') && table.contains("\\u{1b}"), "escaped: {table}");
    assert!(ok(&url, &["outbox", "resume", "billing"], &env).contains("billing resumed"));
    let audit: Vec<(String, String, String)> =
        sqlx::query_as("SELECT actor, action, reason FROM inbox_audit WHERE destination = 'billing' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        audit,
        [
            ("carol".into(), "pause_destination".into(), "billing deploys".into()),
            ("carol".into(), "resume_destination".into(), "resumed by hand".into())
        ]
    );
    assert!(fails(Some(&url), &["outbox", "pause", "Bad Name\x1b", "--reason", "x"])
        .contains("is not a destination's name"));
    assert!(fails(Some(&url), &["outbox", "pause", "billing"]).contains("--reason"), "a pause says why");
}

/// `inbox pause`, `inbox pauses`, `inbox resume`: a provider's events wait,
/// held, counted by `stats`; a resume releases them (in chunks, with
/// progress) for the worker; audited; mistakes named, a stranger's type escaped.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn pause_holds_a_provider_s_events_and_resume_releases_them(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    let env = [("INBOX_OPERATOR", "dana")];
    let paused = ok(&url, &["pause", "--provider", "shopify", "--reason", "orders handler broken"], &env);
    assert!(paused.contains("shopify paused") && paused.contains("inbox resume --provider shopify"), "{paused}");
    let again = ok(&url, &["pause", "--provider", "shopify", "--reason", "again"], &env);
    assert!(again.contains("paused already, by dana") && again.contains("orders handler broken"), "{again}");
    let typed = ["pause", "--provider", "stripe", "--type", "charge.\x1b[31mupdated", "--reason", "x"];
    ok(&url, &typed, &env);
    for i in 0..7 {
        row(&pool, "shopify", &format!("sh_{i}"), "pending", None, "1 minute").await;
    }
    sqlx::query("UPDATE webhook_inbox SET held_by = (SELECT id FROM inbox_pauses WHERE provider = 'shopify')")
        .execute(&pool)
        .await
        .unwrap();
    let table = ok(&url, &["pauses"], &[]);
    assert!(table.contains("shopify") && table.contains("paused") && table.contains("dana"), "{table}");
    assert!(!table.contains('\x1b') && table.contains("\\u{1b}"), "escaped: {table}");
    let listed = json_of(&url, &["pauses", "--json"]);
    let shopify = listed.as_array().unwrap().iter().find(|p| p["provider"] == "shopify").unwrap().clone();
    assert_eq!((shopify["held"].as_i64(), shopify["event_type"].is_null()), (Some(7), true));
    let stats = ok(&url, &["stats"], &[]);
    assert!(stats.contains("paused: 7 of them held"), "{stats}");

    let resumed = ok(&url, &["resume", "--provider", "shopify", "--reason", "fix deployed"], &env);
    assert!(resumed.contains("shopify resumed: 7 held events released"), "{resumed}");
    let held: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE held_by IS NOT NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(held, 0);
    let history = json_of(&url, &["pauses", "--history", "shopify", "--json"]);
    let actions: Vec<&str> = history.as_array().unwrap().iter().map(|r| r["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["pause", "resume", "resumed"]);
    assert_eq!(history[2]["reason"], "7 held events released");

    assert!(fails(Some(&url), &["resume", "--provider", "shopify"]).contains("shopify is not paused"));
    assert!(fails(Some(&url), &["pause", "--provider", "github"]).contains("--reason"), "a pause says why");
    assert!(fails(Some(&url), &["pause", "--provider", "Not Valid", "--reason", "x"]).contains("provider"));
    let long = "t".repeat(129);
    assert!(fails(Some(&url), &["pause", "--provider", "github", "--type", &long, "--reason", "x"])
        .contains("1 to 128 bytes"));
    assert!(fails(Some(&url), &["pause", "--provider", "github", "--reason", "x", "--alarm-after", "soon"])
        .contains("--alarm-after"));
}

/// `inbox alerts evaluate`, `inbox alerts`, `ack`, `resolve`: the rules
/// from INBOX_RULES, one alert for a storm, acknowledged and resolved
/// (audited), its notifications in the outbox; mistakes named; without
/// `[[alert]]`, the defaults.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn alerts_are_evaluated_listed_acknowledged_and_resolved(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    let rules = "[[alert]]\nname = \"marqeta failing\"\ncondition = \"failed\"\nnotify = [{ destination = \"ops\" }]";
    let env = [("INBOX_RULES", rules), ("INBOX_OPERATOR", "erin")];
    assert!(ok(&url, &["alerts", "evaluate"], &env).contains("0 alert(s) opened"));
    for i in 0..12 {
        row(&pool, "marqeta", &format!("tx_{i}"), "failed", Some("account missing"), "1 minute").await;
    }
    let evaluated = ok(&url, &["alerts", "evaluate"], &env);
    assert!(evaluated.contains("1 alert(s) opened") && evaluated.contains("1 notification(s)"), "{evaluated}");
    let table = ok(&url, &["alerts"], &[]);
    assert!(table.contains("marqeta failing") && table.contains("12 events of marqeta failed"), "{table}");
    let listed = json_of(&url, &["alerts", "--json"]);
    let id = listed[0]["id"].as_i64().unwrap().to_string();
    assert_eq!(listed[0]["state"], "open");
    assert!(ok(&url, &["alerts", "ack", &id, "--reason", "on it"], &env).contains("acknowledged"));
    assert!(fails(Some(&url), &["alerts", "ack", &id]).contains("is not open"));
    assert!(ok(&url, &["alerts", "resolve", &id], &env).contains("resolved"));
    assert_eq!(json_of(&url, &["alerts", "--json"]), json!([]));
    assert_eq!(json_of(&url, &["alerts", "--resolved", "--json"])[0]["resolved_by"], "erin");
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT message_key FROM transactional_outbox ORDER BY id").fetch_all(&pool).await.unwrap();
    assert_eq!(keys, [format!("alert:{id}:opened:ops"), format!("alert:{id}:resolved:ops")]);
    let audit: Vec<String> =
        sqlx::query_scalar("SELECT action FROM inbox_audit WHERE alert_id IS NOT NULL ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(audit, ["acknowledge_alert", "resolve_alert"]);
    let out = inbox(Some(&url), &["alerts", "evaluate"], &[("INBOX_RULES", "[[alert]]\ncondition = \"failing\"")]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("INBOX_RULES") && said.contains("unknown variant `failing`"),
        "{said}"
    );
    // No [[alert]] in the file: the defaults, with no channel. The storm above opens `failed` for marqeta,
    // listed, and nothing goes to the outbox.
    let ignore_only = [("INBOX_RULES", "[[ignore]]\nprovider = \"github\"\ntype = \"ping\"")];
    assert!(ok(&url, &["alerts", "evaluate"], &ignore_only)
        .contains("1 alert(s) opened, 0 resolved, 0 reminded; 1 live; 0 notification(s)"));
    let listed = json_of(&url, &["alerts", "--json"]);
    assert_eq!(
        (listed[0]["rule"].as_str(), listed[0]["scope"].as_str()),
        (Some("failed"), Some("marqeta")),
        "{listed}"
    );
    let messages: i64 = sqlx::query_scalar("SELECT count(*) FROM transactional_outbox").fetch_one(&pool).await.unwrap();
    assert_eq!(messages, 2, "the default alerts have no channel");
}

/// `inbox erase`: a dry run counts, a selection by payload erases, one event
/// by id, `show` says so, `replay` refuses; a selection of nothing is refused.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn erase_forgets_a_customer_and_says_what_it_did(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    for (id, who) in [("evt_1", "ann@example.com"), ("evt_2", "ann@example.com"), ("evt_3", "bob@example.com")] {
        sqlx::query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, secret_index, processed_at)
             VALUES ('stripe', $1, 'charge.succeeded', jsonb_build_object('email', $2::text), 'done', convert_to($2, 'UTF8'), 0, now())",
        )
        .bind(id)
        .bind(who)
        .execute(&pool)
        .await
        .unwrap();
    }
    let env = [("INBOX_OPERATOR", "dpo")];
    let dry =
        ok(&url, &["erase", "--payload", "ann@example.com", "--since", "1d", "--dry-run", "--reason", "GDPR #1"], &env);
    assert!(dry.contains("2 event(s) selected: 2 would be erased"), "{dry}");
    let done = ok(&url, &["erase", "--payload", "ann@example.com", "--since", "1d", "--reason", "GDPR #1"], &env);
    assert!(done.contains("2 event(s) selected: 2 erased"), "{done}");
    let one = ok(&url, &["erase", "--provider", "stripe", "--id", "evt_3", "--reason", "GDPR #2"], &env);
    assert!(one.contains("stripe evt_3 erased") && one.contains("a redelivery is still a duplicate"), "{one}");
    assert!(fails(Some(&url), &["erase", "--provider", "stripe", "--id", "evt_3", "--reason", "x"])
        .contains("erased already"));
    let shown = ok(&url, &["show", "stripe", "evt_1"], &[]);
    assert!(shown.contains("erased on") && shown.contains("by dpo"), "{shown}");
    assert!(fails(Some(&url), &["replay", "stripe", "evt_1"]).contains("was erased on"));
    assert!(fails(Some(&url), &["erase", "--reason", "x"]).contains("name what to erase"));
    assert!(fails(Some(&url), &["erase", "--id", "evt_1", "--reason", "x"]).contains("--provider"));
    assert!(fails(Some(&url), &["erase", "--provider", "stripe", "--id", "evt_1"]).contains("--reason"));
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE payload IS NOT NULL OR raw_body IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(left, 0);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn prune_archives_to_s3_and_restore_puts_the_events_back(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    // Stripe's events as receive stores them: the payload what the bytes say.
    for (id, age) in [("evt_1", "100 days"), ("evt_2", "100 days"), ("evt_recent", "1 day")] {
        let body = json!({"id": id, "type": "charge.succeeded", "data": {"object": {}}}).to_string();
        sqlx::query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, secret_index,
                                        received_at, processed_at)
             VALUES ('stripe', $1, 'charge.succeeded', $2::jsonb, 'done', convert_to($2, 'UTF8'), 0,
                     now() - $3::interval, now() - $3::interval)",
        )
        .bind(id)
        .bind(&body)
        .bind(age)
        .execute(&pool)
        .await
        .unwrap();
    }
    let moto = inbox_tests::Moto::start();
    let aws = [
        ("INBOX_ARCHIVE_S3_BUCKET", "the-archive"),
        ("AWS_ENDPOINT_URL", moto.url.as_str()),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ];
    // No bucket yet: nothing is deleted, and the command fails saying why.
    let out = inbox(Some(&url), &["prune"], &aws);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("2 inbox rows kept, not archived"), "{stderr}");
    assert!(stderr.contains("s3://the-archive/inbox/stripe/") && stderr.contains("NoSuchBucket"), "{stderr}");
    assert_eq!(sqlx::query_scalar::<_, i64>("SELECT count(*) FROM webhook_inbox").fetch_one(&pool).await.unwrap(), 3);

    moto.bucket("the-archive").await;
    let pruned = ok(&url, &["prune"], &aws);
    assert!(pruned.contains("pruned: 2 done") && pruned.contains("archived: 2 inbox rows in 1 objects"), "{pruned}");
    let day: String =
        sqlx::query_scalar("SELECT to_char(now() - interval '100 days', 'YYYY-MM-DD')").fetch_one(&pool).await.unwrap();
    let listed = ok(&url, &["archive", "list"], &aws);
    assert!(listed.contains("PROVIDER") && listed.contains(&format!("stripe    {day}  2")), "{listed}");
    let objects: Value = serde_json::from_str(&ok(
        &url,
        &["archive", "list", "--provider", "stripe", "--day", &day[..7], "--json"],
        &aws,
    ))
    .unwrap();
    assert_eq!(objects[0]["events"], 2, "{objects}");

    // Into a fresh database: a dry run first, then the month, then again (all duplicates).
    let name = opts.get_database().unwrap();
    let fresh = format!("restored_{}", &name[name.len() - 16..]);
    // A run stopped before its end leaves it behind.
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{fresh}\" WITH (FORCE)")).execute(&pool).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE \"{fresh}\"")).execute(&pool).await.unwrap();
    let fresh_opts = opts.clone().database(&fresh);
    let fresh_pool = PgPoolOptions::new().connect_with(fresh_opts.clone()).await.unwrap();
    inbox_tests::MIGRATOR.run(&fresh_pool).await.unwrap();
    let fresh_url = url_of(&fresh_opts);
    let month = format!("s3://the-archive/inbox/stripe/{}", &day[..7]);
    // No Stripe secret here to verify them with: refused, saying so, until taken knowingly.
    let refused = inbox(Some(&fresh_url), &["restore", &month], &aws);
    assert!(!refused.status.success(), "a restore that refused lines fails");
    let refused = format!("{}{}", String::from_utf8_lossy(&refused.stdout), String::from_utf8_lossy(&refused.stderr));
    assert!(refused.contains("0 restored") && refused.contains("no stripe secret is configured here"), "{refused}");
    assert!(refused.contains("--unverified"), "{refused}");
    let dry = ok(&fresh_url, &["restore", &month, "--dry-run", "--unverified"], &aws);
    assert!(dry.contains("1 object(s), 2 event(s): 2 would be restored") && dry.contains("nothing changed"), "{dry}");
    let done = ok(&fresh_url, &["restore", &month, "--unverified"], &aws);
    assert!(done.contains("2 restored, 0 stored already") && done.contains("inbox requeue"), "{done}");
    assert!(done.contains("2 of them not verified"), "{done}");
    let shown = ok(&fresh_url, &["show", "stripe", "evt_1"], &[]);
    assert!(shown.contains("restored from prune's archive on"), "{shown}");
    let again = ok(&fresh_url, &["restore", &month, "--unverified"], &aws);
    assert!(again.contains("0 restored, 2 stored already"), "{again}");
    let requeued = ok(&fresh_url, &["requeue", "--status", "done", "--provider", "stripe"], &[]);
    assert!(requeued.contains('2'), "{requeued}");
    assert!(fails(Some(&fresh_url), &["restore", "s3:///x"]).contains("names no bucket"));
    let missing = inbox(Some(&fresh_url), &["restore", "s3://the-archive/inbox/github/"], &aws);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no object under s3://the-archive/inbox/github/"));
    fresh_pool.close().await;
    sqlx::query(&format!("DROP DATABASE \"{fresh}\" WITH (FORCE)")).execute(&pool).await.unwrap();
}

/// `inbox jobs`: the API's background jobs listed, one shown, a running one
/// cancelled under the operator's name (audited without a token), an ended
/// one and a missing one refused with why.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn jobs_lists_shows_and_cancels_the_api_s_jobs(pool_options: PgPoolOptions, opts: PgConnectOptions) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    let url = url_of(&opts);
    assert_eq!(json_of(&url, &["jobs", "--json"]), json!([]));
    let ids: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO inbox_api_jobs (kind, params, state, estimate, processed, created_by, finished_at)
         VALUES ('erase', '{\"provider\": \"stripe\"}', 'succeeded', 3, 3, 'ops-bot', now()),
                ('requeue', '{\"statuses\": [\"failed\"]}', 'running', 900, 120, 'ops-bot', NULL)
         RETURNING id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let (ended, running) = (ids[0].to_string(), ids[1].to_string());
    let table = ok(&url, &["jobs"], &[]);
    assert!(table.contains("requeue") && table.contains("120/900") && table.contains("ops-bot"), "{table}");
    let listed = json_of(&url, &["jobs", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(listed[0]["id"], ids[1], "newest first");
    let shown = ok(&url, &["jobs", "show", &ended], &[]);
    assert!(shown.contains("succeeded") && shown.contains(r#"asked: {"provider":"stripe"}"#), "{shown}");
    let env = [("INBOX_OPERATOR", "erin")];
    assert!(ok(&url, &["jobs", "cancel", &running], &env).contains("asked to stop"));
    let cancelled = json_of(&url, &["jobs", "show", &running, "--json"]);
    assert_eq!(cancelled["cancelled_by"], "erin");
    assert!(cancelled["cancel_requested_at"].is_string(), "{cancelled}");
    let audit: (String, String, Option<String>) =
        sqlx::query_as("SELECT actor, action, api_token FROM inbox_audit WHERE job_id = $1")
            .bind(ids[1])
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(audit, ("erin".into(), "cancel_job".into(), None));
    assert!(fails(Some(&url), &["jobs", "cancel", &ended]).contains("nothing to cancel"));
    assert!(fails(Some(&url), &["jobs", "show", "999999"]).contains("no job 999999"));
}

/// `inbox console user|token add|remove|revoke --json`: what each did, as
/// JSON, with a password or token made here shown that once.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn console_users_and_tokens_answer_in_json(_: PgPoolOptions, opts: PgConnectOptions) {
    let url = url_of(&opts);
    let added = json_of(&url, &["console", "user", "add", "ann", "--role", "viewer", "--json"]);
    assert_eq!((added["name"].as_str(), added["role"].as_str()), (Some("ann"), Some("viewer")), "{added}");
    assert!(added["password"].as_str().is_some_and(|p| p.len() >= 12), "{added}");
    let removed = json_of(&url, &["console", "user", "remove", "ann", "--json"]);
    assert_eq!(removed, json!({"name": "ann", "done": "removed, and signed out everywhere"}));
    let token = json_of(&url, &["console", "token", "add", "ci", "--role", "operator", "--json"]);
    assert!(token["token"].as_str().is_some_and(|t| !t.is_empty()), "{token}");
    assert_eq!(json_of(&url, &["console", "token", "revoke", "ci", "--json"])["done"], "revoked");
}
