//! Reconcile from GitHub's hook deliveries API, and an answer over its limit:
//! exactly the missing deliveries across pages, a stop on an API error with the
//! checkpoint unmoved.

use inbox_tests::later;
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    config::Secret,
    reconciliation::{GithubDeliveries, Hook, Reconciler, Source, StripeEvents},
};
use webhook_inbox_schemes::Provider;
use wiremock::{
    matchers::{header, method, path, query_param},
    Mock, MockServer, ResponseTemplate,
};

use crate::reconcile::config;

/// A delivery as GitHub's list shows it, `n` minutes ago.
fn listed(id: u64, guid: &str, minutes_ago: u64, event: &str) -> Value {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let at = inbox_tests::rfc3339(now - 60 * minutes_ago as i64);
    json!({"id": id, "guid": guid, "delivered_at": at, "redelivery": false, "duration": 0.27, "status": "Invalid HTTP Response: 503",
           "status_code": 503, "event": event, "action": "opened", "installation_id": null, "repository_id": 1})
}

/// The delivery with its request, as `GET .../deliveries/<id>` answers.
fn detail(id: u64, guid: &str, event: &str, payload: Value) -> Value {
    json!({"id": id, "guid": guid, "event": event, "action": payload["action"],
           "request": {"headers": {"X-GitHub-Delivery": guid, "X-GitHub-Event": event, "X-GitHub-Hook-ID": "12",
                                   "X-Hub-Signature-256": "sha256=00", "User-Agent": "GitHub-Hookshot/abc", "Content-Type": "application/json"},
                       "payload": payload},
           "response": {"headers": {}, "payload": "down"}})
}

const HOOK: &str = "repos/octo/hello/hooks/12";

async fn github_api(server: &MockServer) {
    let page2 = format!("{}/{HOOK}/deliveries?per_page=100&cursor=v1_2", server.uri());
    // Page 1: d-3 (missing), d-2 twice (a redelivery shares its guid; missing), d-1 (arrived as a webhook).
    // The newest 6 minutes old: older than the next run's overlap (5 minutes) even a second or more later.
    Mock::given(method("GET"))
        .and(path(format!("/{HOOK}/deliveries")))
        .and(header("authorization", "Bearer ghp_fake"))
        .and(query_param("per_page", "100"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("Link", format!(r#"<{page2}>; rel="next""#).as_str())
                .set_body_json(json!([
                    listed(4, "d-3", 6, "issues"),
                    listed(3, "d-2", 7, "issues"),
                    listed(2, "d-2", 8, "issues"),
                    listed(1, "d-1", 9, "issues")
                ])),
        )
        .with_priority(2)
        .mount(server)
        .await;
    // Page 2: d-0 (missing), d-bad (its payload gone: 404), and one from before the lookback (not taken).
    Mock::given(method("GET"))
        .and(path(format!("/{HOOK}/deliveries")))
        .and(query_param("cursor", "v1_2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            listed(11, "d-0", 10, "pull_request"),
            listed(12, "d-bad", 11, "issues"),
            listed(13, "d-old", 60 * 24 * 5, "issues")
        ])))
        .with_priority(1)
        .mount(server)
        .await;
    for (id, guid, event, action) in [
        (4, "d-3", "issues", "opened"),
        (3, "d-2", "issues", "closed"),
        (1, "d-1", "issues", "opened"),
        (11, "d-0", "pull_request", "opened"),
    ] {
        Mock::given(method("GET"))
            .and(path(format!("/{HOOK}/deliveries/{id}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(detail(
                id,
                guid,
                event,
                json!({"action": action, "n": id}),
            )))
            .mount(server)
            .await;
    }
    Mock::given(method("GET"))
        .and(path(format!("/{HOOK}/deliveries/12")))
        .respond_with(ResponseTemplate::new(404).set_body_json(json!({"message": "Not Found"})))
        .mount(server)
        .await;
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn github_reconcile_claims_exactly_the_missing_deliveries_across_pages_and_nothing_twice(pool: PgPool) {
    let server = MockServer::start().await;
    github_api(&server).await;
    // d-1 did arrive, as a webhook.
    let body = json!({"action": "opened", "n": 1}).to_string();
    inbox_tests::store(&pool, Provider::GITHUB, "d-1", "issues.opened", &body).await;

    let hook = GithubDeliveries::new(server.uri(), Secret::new("ghp_fake"), Hook::parse(HOOK).unwrap()).unwrap();
    assert_eq!(hook.name(), "github repos/octo/hello/hooks/12");
    let first = hook.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!(
        (first.fetched, first.applied, first.already_known, first.failed, first.finished),
        (5, 3, 1, 1, true),
        "{first:?}"
    );
    let rows: Vec<(String, String, String, String)> =
        sqlx::query_as("SELECT event_id, event_type, status, source FROM webhook_inbox ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let ids: Vec<(&str, &str, &str, &str)> =
        rows.iter().map(|r| (r.0.as_str(), r.1.as_str(), r.2.as_str(), r.3.as_str())).collect();
    assert_eq!(
        ids,
        [
            ("d-0", "pull_request.opened", "pending", "reconcile"),
            ("d-1", "issues.opened", "pending", "webhook"),
            ("d-2", "issues.closed", "pending", "reconcile"),
            ("d-3", "issues.opened", "pending", "reconcile"),
            ("reconcile:github:d-bad", "issues", "failed", "reconcile"),
        ],
        "under receive's event id, with receive's event type (the event and the payload's action)"
    );
    let (payload, headers): (Value, Value) =
        sqlx::query_as("SELECT payload, headers FROM webhook_inbox WHERE event_id = 'd-0'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(payload, json!({"action": "opened", "n": 11}), "the payload of the delivery's request");
    assert_eq!(
        headers,
        json!({"x-github-delivery": "d-0", "x-github-event": "pull_request", "x-github-hook-id": "12",
               "x-hub-signature-256": "sha256=00", "content-type": "application/json"}),
        "the headers receive keeps, as GitHub recorded them"
    );
    let details: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.url.path().to_string())
        .filter(|p| !p.ends_with("/deliveries"))
        .collect();
    assert_eq!(
        details.len(),
        4,
        "one payload fetched per missing guid (d-2 once, d-1 never, d-old never): {details:?}"
    );

    let checkpoint: i64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM checkpoint)::bigint FROM reconcile_checkpoints WHERE source = 'github:repos/octo/hello/hooks/12'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now - 10..=now + 1).contains(&checkpoint), "checkpointed per hook at the run's start");

    // The next run walks down to the checkpoint (less 5 minutes' overlap): these are older.
    server.reset().await;
    github_api(&server).await;
    let second = hook.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((second.fetched, second.finished), (0, true), "{second:?}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1, "one page, no payload fetched");
    // Without the checkpoint, the same deliveries again: nothing claimed twice.
    sqlx::query("DELETE FROM reconcile_checkpoints").execute(&pool).await.unwrap();
    let third = hook.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((third.applied, third.already_known, third.failed), (0, 4, 1), "run twice, nothing twice: {third:?}");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(count, 5);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn github_reconcile_stops_on_an_api_error_with_its_checkpoint_unmoved_and_claims_it_next_time(pool: PgPool) {
    let server = MockServer::start().await;
    // The second page fails first: the run stops, what the first page found stays claimed.
    Mock::given(method("GET"))
        .and(path(format!("/{HOOK}/deliveries")))
        .and(query_param("cursor", "v1_2"))
        .respond_with(ResponseTemplate::new(502).set_body_string("<html>bad gateway</html>"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    github_api(&server).await;
    let hook = GithubDeliveries::new(server.uri(), Secret::new("ghp_fake"), Hook::parse(HOOK).unwrap()).unwrap();
    let err = hook.reconcile(&pool, &config(), later()).await.unwrap_err();
    assert!(err.to_string().contains("HTTP 502"), "{err}");
    let checkpoints: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reconcile_checkpoints").fetch_one(&pool).await.unwrap();
    assert_eq!(checkpoints, 0, "no checkpoint from a run that failed");
    let claimed: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(claimed, 3, "the first page's d-3, d-2 and d-1 are claimed (committed one by one)");
    let again = hook.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((again.applied, again.already_known, again.failed, again.finished), (1, 3, 1, true), "{again:?}");

    // A link to another host is not followed: the token stays home.
    let other = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("Link", format!(r#"<{}/{HOOK}/deliveries?cursor=x>; rel="next""#, other.uri()).as_str())
                .set_body_json(json!([listed(99, "d-99", 1, "issues")])),
        )
        .mount(&other)
        .await;
    let hostile = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header(
                    "Link",
                    format!(r#"<{}/app/hook/deliveries?cursor=x>; rel="next""#, other.uri()).as_str(),
                )
                .set_body_json(json!([listed(1, "d-1", 1, "issues")])),
        )
        .mount(&hostile)
        .await;
    let err = GithubDeliveries::new(hostile.uri(), Secret::new("ghp_fake"), Hook::parse("app").unwrap())
        .unwrap()
        .reconcile(&pool, &config(), later())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("another host"), "{err}");
    assert!(other.received_requests().await.unwrap().is_empty(), "nothing sent to the other host");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_answer_over_16_mib_is_refused_unread_and_says_so(pool: PgPool) {
    let huge = format!(r#"{{"object": "list", "has_more": false, "data": [], "pad": "{}"}}"#, "x".repeat(17 << 20));
    let stripe = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/events"))
        .respond_with(ResponseTemplate::new(200).set_body_string(huge.clone()))
        .mount(&stripe)
        .await;
    let reconciler = Reconciler::new(pool.clone(), config())
        .with_source(std::sync::Arc::new(StripeEvents::new(stripe.uri(), Secret::new("sk_test_fake")).unwrap()));
    let reconciled = reconciler.run_once(later()).await;
    let why = &reconciled.failed["stripe events"];
    assert!(why.contains("over 16 MiB"), "{reconciled:?}");
    assert_eq!(sqlx::query_scalar::<_, i64>("SELECT count(*) FROM webhook_inbox").fetch_one(&pool).await.unwrap(), 0);
}
