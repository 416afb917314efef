//! The console's newer screens and actions: an audit reason over its limit,
//! ignored events, pauses, alerts, erasing one event and what a selection finds.

use http::StatusCode;
use sqlx::PgPool;
use webhook_inbox::Provider;

use crate::console::{failed, form, scalar, Console};

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_audit_reason_over_its_limit_is_refused_and_nothing_is_done(pool: PgPool) {
    failed(&pool, 1).await;
    let c = Console::new(&pool, &pool).await;
    let (cookie, csrf) = c.session("olga").await;
    let long = "why ".repeat(200);
    let replay = form(&[("provider", "stripe"), ("id", "evt_1"), ("csrf", &csrf), ("reason", &long)]);
    let refused = c.send("POST", "/event/replay", Some(&cookie), Some(&replay)).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(refused.body.contains("a reason is at most 500 characters"), "{}", refused.body);
    assert_eq!(scalar::<String>(&pool, "SELECT status FROM webhook_inbox").await, "failed");
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM inbox_audit WHERE event_id IS NOT NULL").await, 0);
}

/// An ignored event: listed under its status, and its page says which rule ignored it, not that it failed.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_ignored_event_is_listed_and_shown_with_its_rule(pool: PgPool) {
    inbox_tests::store(&pool, Provider::GITHUB, "gh_ping", "ping", "{}").await;
    let reason = r##"ignored by the rule "#1" (INBOX_RULES_FILE)"##;
    sqlx::query("UPDATE webhook_inbox SET status = 'ignored', processed_at = now(), failure_reason = $1")
        .bind(reason)
        .execute(&pool)
        .await
        .unwrap();
    let c = Console::new(&pool, &pool).await;
    let (cookie, _) = c.session("olga").await;
    let listed = c.send("GET", "/events?status=ignored", Some(&cookie), None).await;
    assert!(listed.body.contains("gh_ping"), "{}", listed.body);
    let page = c.send("GET", "/event?provider=github&id=gh_ping", Some(&cookie), None).await;
    assert!(page.body.contains("Why it was ignored") && !page.body.contains("Failure reason"), "{}", page.body);
    assert!(page.body.contains("ignored by the rule &#34;#1&#34;"), "{}", page.body);
}

/// The Pauses page: an operator pauses a provider's type and resumes it
/// (confirmed, audited, CSRF-checked); a viewer sees it and cannot act; a held
/// event's page says so; a stranger's type is escaped; a bad scope is a 400.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_provider_s_type_is_paused_and_resumed_from_the_pauses_page(pool: PgPool) {
    let c = Console::new(&pool, &pool).await;
    let (cookie, csrf) = c.session("olga").await;
    let page = c.send("GET", "/pauses", Some(&cookie), None).await;
    assert!(page.body.contains("Nothing is paused") && page.body.contains("Pause processing"), "{}", page.body);

    let confirm = c.send("GET", "/pause?provider=shopify&type=orders%2Fpaid", Some(&cookie), None).await;
    assert!(confirm.body.contains("Pause shopify orders/paid?"), "{}", confirm.body);
    assert!(confirm.body.contains("spending no attempt"), "{}", confirm.body);
    let pause = form(&[
        ("provider", "shopify"),
        ("type", "orders/paid"),
        ("pause", "yes"),
        ("reason", "orders handler broken"),
        ("csrf", &csrf),
    ]);
    let paused = c.send("POST", "/pause", Some(&cookie), Some(&pause)).await;
    assert_eq!(paused.status, StatusCode::SEE_OTHER);
    assert_eq!(paused.location, "/pauses?paused=shopify+orders%2Fpaid");
    let again = c.send("POST", "/pause", Some(&cookie), Some(&pause)).await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST, "paused already: nothing done");
    let refused = c.send("GET", "/pause?provider=shopify&type=orders%2Fpaid", Some(&cookie), None).await;
    assert!(refused.body.contains("is paused already, by console:olga"), "{}", refused.body);

    inbox_tests::store(&pool, Provider::SHOPIFY, "sh_1", "orders/paid", "{}").await;
    sqlx::query("UPDATE webhook_inbox SET held_by = (SELECT id FROM inbox_pauses)").execute(&pool).await.unwrap();
    let event = c.send("GET", "/event?provider=shopify&id=sh_1", Some(&cookie), None).await;
    assert!(event.body.contains("Held by a pause"), "{}", event.body);
    let health = c.send("GET", "/health", Some(&cookie), None).await;
    assert!(health.body.contains("Held by"), "{}", health.body);

    let (viewer, viewer_csrf) = c.session("vic").await;
    let seen = c.send("GET", "/pauses", Some(&viewer), None).await;
    assert!(seen.body.contains("orders handler broken") && seen.body.contains(">1<"), "{}", seen.body);
    assert!(!seen.body.contains("Resume…") && !seen.body.contains("Pause processing"), "{}", seen.body);
    assert_eq!(c.send("GET", "/pause?provider=shopify", Some(&viewer), None).await.status, StatusCode::FORBIDDEN);
    let as_viewer = form(&[("provider", "shopify"), ("pause", "yes"), ("reason", "x"), ("csrf", &viewer_csrf)]);
    assert_eq!(c.send("POST", "/pause", Some(&viewer), Some(&as_viewer)).await.status, StatusCode::FORBIDDEN);
    let forged = form(&[("provider", "shopify"), ("pause", "yes"), ("reason", "x"), ("csrf", "forged")]);
    assert_eq!(c.send("POST", "/pause", Some(&cookie), Some(&forged)).await.status, StatusCode::FORBIDDEN);
    for bad in ["/pause?provider=Sh%3Cb%3E".to_string(), format!("/pause?provider=shopify&type={}", "t".repeat(129))] {
        assert_eq!(c.send("GET", &bad, Some(&cookie), None).await.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let hostile = form(&[("provider", "stripe"), ("type", "<script>x</script>"), ("pause", "yes"), ("csrf", &csrf)]);
    c.send("POST", "/pause", Some(&cookie), Some(&hostile)).await;
    let listed = c.send("GET", "/pauses", Some(&cookie), None).await;
    assert!(!listed.body.contains("<script>x") && listed.body.contains("&#60;script&#62;x"), "{}", listed.body);

    let page = c.send("GET", "/pauses", Some(&cookie), None).await;
    assert!(page.body.contains("/pause?provider=shopify&#38;type=orders%2Fpaid&#38;pause=no"), "{}", page.body);
    let resume = form(&[("provider", "shopify"), ("type", "orders/paid"), ("pause", "no"), ("csrf", &csrf)]);
    let resumed = c.send("POST", "/pause", Some(&cookie), Some(&resume)).await;
    assert_eq!(resumed.location, "/pauses?resumed=shopify+orders%2Fpaid");
    let resuming: bool =
        scalar(&pool, "SELECT resuming_at IS NOT NULL FROM inbox_pauses WHERE provider = 'shopify'").await;
    assert!(resuming, "resuming: the workers release its events");
    let audit: Vec<(String, String, String)> =
        sqlx::query_as("SELECT actor, action, reason FROM inbox_audit WHERE provider = 'shopify' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        audit,
        [
            ("console:olga".into(), "pause".into(), "orders handler broken".into()),
            ("console:olga".into(), "resume".into(), "resumed from the console".into())
        ]
    );
}

/// The Alerts page: live and resolved alerts; an operator acknowledges and
/// resolves (confirmed, audited, CSRF-checked); a viewer cannot; a
/// stranger's text in a summary is escaped.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn alerts_are_listed_acknowledged_and_resolved_from_the_alerts_page(pool: PgPool) {
    sqlx::query(
        "INSERT INTO relay_destinations (name, opened_at, failures, last_error) VALUES ('billing', now(), 10, '<script>x</script>')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let rules = webhook_inbox::alerts::AlertRules::parse("[[alert]]\ncondition = \"circuit_open\"").unwrap();
    rules.evaluate(&pool, std::time::Duration::ZERO).await.unwrap();
    let c = Console::new(&pool, &pool).await;
    let (cookie, csrf) = c.session("olga").await;
    let page = c.send("GET", "/alerts", Some(&cookie), None).await;
    assert!(
        page.body.contains("circuit_open") && page.body.contains("the circuit of billing is open"),
        "{}",
        page.body
    );
    assert!(!page.body.contains("<script>x") && page.body.contains("&#60;script&#62;x"), "{}", page.body);
    let id: i64 = scalar(&pool, "SELECT id FROM inbox_alerts").await;
    assert!(page.body.contains(&format!("/alert?id={id}&#38;act=ack")), "{}", page.body);

    let (viewer, viewer_csrf) = c.session("vic").await;
    let seen = c.send("GET", "/alerts", Some(&viewer), None).await;
    assert!(seen.body.contains("circuit_open") && !seen.body.contains("Acknowledge…"), "{}", seen.body);
    let path = format!("/alert?id={id}&act=ack");
    assert_eq!(c.send("GET", &path, Some(&viewer), None).await.status, StatusCode::FORBIDDEN);
    let ack = |csrf: &str| form(&[("id", &id.to_string()), ("act", "ack"), ("reason", "on it"), ("csrf", csrf)]);
    assert_eq!(c.send("POST", "/alert", Some(&viewer), Some(&ack(&viewer_csrf))).await.status, StatusCode::FORBIDDEN);
    assert_eq!(c.send("POST", "/alert", Some(&cookie), Some(&ack("forged"))).await.status, StatusCode::FORBIDDEN);
    assert_eq!(c.send("GET", "/alert?id=x&act=ack", Some(&cookie), None).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(c.send("GET", "/alert?id=1&act=delete", Some(&cookie), None).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(c.send("GET", "/alert?id=999&act=ack", Some(&cookie), None).await.status, StatusCode::NOT_FOUND);

    let confirm = c.send("GET", &path, Some(&cookie), None).await;
    assert!(confirm.body.contains(&format!("Acknowledge alert #{id}?")), "{}", confirm.body);
    let acked = c.send("POST", "/alert", Some(&cookie), Some(&ack(&csrf))).await;
    assert_eq!((acked.status, acked.location.as_str()), (StatusCode::SEE_OTHER, "/alerts?done=ack"));
    assert_eq!(c.send("POST", "/alert", Some(&cookie), Some(&ack(&csrf))).await.status, StatusCode::BAD_REQUEST);
    let resolve = form(&[("id", &id.to_string()), ("act", "resolve"), ("reason", ""), ("csrf", &csrf)]);
    assert_eq!(c.send("POST", "/alert", Some(&cookie), Some(&resolve)).await.location, "/alerts?done=resolve");
    let page = c.send("GET", "/alerts", Some(&cookie), None).await;
    assert!(page.body.contains("No alert is open") && page.body.contains("resolved by console:olga"), "{}", page.body);
    let audit: Vec<(String, String, String)> =
        sqlx::query_as("SELECT actor, action, reason FROM inbox_audit WHERE alert_id IS NOT NULL ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        audit,
        [
            ("console:olga".into(), "acknowledge_alert".into(), "on it".into()),
            ("console:olga".into(), "resolve_alert".into(), "resolved from the console".into())
        ]
    );
}

/// An erased event's page says so and offers no replay; a replay posted anyway is refused, saying why.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_erased_event_is_shown_as_erased_and_cannot_be_replayed(pool: PgPool) {
    failed(&pool, 1).await;
    let by = webhook_inbox::ops::Audit { actor: "dpo", action: "erase", reason: "GDPR" };
    webhook_inbox::ops::erase(&pool, "stripe", "evt_1", &by).await.unwrap();
    let c = Console::new(&pool, &pool).await;
    let (cookie, csrf) = c.session("olga").await;
    let page = c.send("GET", "/event?provider=stripe&id=evt_1", Some(&cookie), None).await;
    assert!(page.body.contains("id=\"erased\"") && page.body.contains("by dpo"), "{}", page.body);
    assert!(!page.body.contains("Replay…"), "{}", page.body);
    let replay = form(&[("provider", "stripe"), ("id", "evt_1"), ("csrf", &csrf)]);
    let refused = c.send("POST", "/event/replay", Some(&cookie), Some(&replay)).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(refused.body.contains("was erased on"), "{}", refused.body);
}

/// An operator erases an event from its page (confirmed, audited); a viewer cannot; a pending one is refused.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_operator_erases_an_event_from_its_page(pool: PgPool) {
    failed(&pool, 1).await;
    inbox_tests::store(&pool, Provider::GITHUB, "gh_pending", "push", "{}").await;
    let c = Console::new(&pool, &pool).await;
    let (cookie, csrf) = c.session("olga").await;
    let page = c.send("GET", "/event?provider=stripe&id=evt_1", Some(&cookie), None).await;
    assert!(page.body.contains("/event/erase?provider=stripe&#38;id=evt_1"), "{}", page.body);
    let (viewer, viewer_csrf) = c.session("vic").await;
    assert_eq!(
        c.send("GET", "/event/erase?provider=stripe&id=evt_1", Some(&viewer), None).await.status,
        StatusCode::FORBIDDEN
    );
    let erase = |csrf: &str| form(&[("provider", "stripe"), ("id", "evt_1"), ("reason", "GDPR #7"), ("csrf", csrf)]);
    assert_eq!(
        c.send("POST", "/event/erase", Some(&viewer), Some(&erase(&viewer_csrf))).await.status,
        StatusCode::FORBIDDEN
    );
    let confirm = c.send("GET", "/event/erase?provider=stripe&id=evt_1", Some(&cookie), None).await;
    assert!(
        confirm.body.contains("Erase this event?") && confirm.body.contains("cannot be undone"),
        "{}",
        confirm.body
    );
    let erased = c.send("POST", "/event/erase", Some(&cookie), Some(&erase(&csrf))).await;
    assert_eq!(erased.location, "/event?provider=stripe&id=evt_1&done=erased");
    let page = c.send("GET", "/event?provider=stripe&id=evt_1&done=erased", Some(&cookie), None).await;
    assert!(page.body.contains("by console:olga") && !page.body.contains("Erase…"), "{}", page.body);
    assert_eq!(
        c.send("POST", "/event/erase", Some(&cookie), Some(&erase(&csrf))).await.status,
        StatusCode::BAD_REQUEST
    );
    let pending = c.send("GET", "/event/erase?provider=github&id=gh_pending", Some(&cookie), None).await;
    assert!(pending.body.contains("is pending"), "{}", pending.body);
    let audit: (String, String) =
        sqlx::query_as("SELECT actor, reason FROM inbox_audit WHERE action = 'erase'").fetch_one(&pool).await.unwrap();
    assert_eq!(audit, ("console:olga".into(), "GDPR #7".into()));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_operator_erases_what_a_selection_finds(pool: PgPool) {
    for (id, status, who) in [
        ("evt_a", "done", "ann@example.com"),
        ("evt_b", "failed", "ann@example.com"),
        ("evt_c", "done", "bob@example.com"),
    ] {
        sqlx::query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, secret_index, processed_at,
                                        failure_reason)
             VALUES ('stripe', $1, 'charge.succeeded', jsonb_build_object('email', $3::text), $2, '{}', 0, now(),
                     CASE WHEN $2 = 'failed' THEN 'boom' END)",
        )
        .bind(id)
        .bind(status)
        .bind(who)
        .execute(&pool)
        .await
        .unwrap();
    }
    inbox_tests::store(&pool, Provider::STRIPE, "evt_pending", "charge.succeeded", r#"{"email":"ann@example.com"}"#)
        .await;
    let c = Console::new(&pool, &pool).await;
    let (cookie, csrf) = c.session("olga").await;
    let (viewer, viewer_csrf) = c.session("vic").await;
    let listing = c.send("GET", "/events?q=ann%40example.com&since=1d", Some(&cookie), None).await;
    assert!(listing.body.contains("Erase what this filter selects"), "{}", listing.body);
    let as_viewer = c.send("GET", "/events?q=ann%40example.com&since=1d", Some(&viewer), None).await;
    assert!(!as_viewer.body.contains("Erase what this filter selects"));
    assert_eq!(
        c.send("GET", "/erase?q=ann%40example.com&since=1d", Some(&viewer), None).await.status,
        StatusCode::FORBIDDEN
    );
    let confirm = c.send("GET", "/erase?q=ann%40example.com&since=1d", Some(&cookie), None).await;
    assert!(
        confirm.body.contains("Erase 2 event(s)?") && confirm.body.contains("1 of them are pending"),
        "{}",
        confirm.body
    );
    let empty = c.send("GET", "/erase", Some(&cookie), None).await;
    assert!(empty.body.contains("Count them") && !empty.body.contains("event(s)?"), "{}", empty.body);
    let erase = |csrf: &str| form(&[("q", "ann@example.com"), ("since", "1d"), ("reason", "GDPR #9"), ("csrf", csrf)]);
    assert_eq!(c.send("POST", "/erase", Some(&viewer), Some(&erase(&viewer_csrf))).await.status, StatusCode::FORBIDDEN);
    let nothing = form(&[("reason", "GDPR #9"), ("csrf", &csrf)]);
    assert_eq!(c.send("POST", "/erase", Some(&cookie), Some(&nothing)).await.status, StatusCode::BAD_REQUEST);
    let done = c.send("POST", "/erase", Some(&cookie), Some(&erase(&csrf))).await;
    assert!(done.body.contains("Done: 2 erased, 0 erased already, 1 pending left"), "{}", done.body);
    let left: Vec<String> =
        sqlx::query_scalar("SELECT event_id FROM webhook_inbox WHERE payload::text LIKE '%ann@%' ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(left, ["evt_pending"]);
    let audit: Vec<(String, String)> =
        sqlx::query_as("SELECT actor, reason FROM inbox_audit WHERE action = 'erase' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(audit, [("console:olga".into(), "GDPR #9".into()), ("console:olga".into(), "GDPR #9".into())]);
}
