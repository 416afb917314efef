//! Reconcile against a real PostgreSQL and local fakes of the Stripe,
//! Shopify and GitHub APIs (wiremock).

use inbox_tests::{later, store};
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    config::Secret,
    reconciliation::{ReconcileConfig, Reconciler, ShopifyOrders, Source, StripeEvents},
    Stage, Worker,
};
use webhook_inbox_schemes::Provider;
use wiremock::{
    matchers::{header, method, path, query_param},
    Mock, MockServer, ResponseTemplate,
};

pub(crate) fn config() -> ReconcileConfig {
    ReconcileConfig {
        first_lookback: std::time::Duration::from_secs(2 * 3600),
        overlap: std::time::Duration::from_secs(300),
        // One window: these tests are about what a window does.
        window: std::time::Duration::from_secs(24 * 3600),
    }
}

/// An event created `n` seconds after an hour ago.
fn stripe_event(n: i64) -> Value {
    let an_hour_ago =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64 - 3600;
    json!({"id": format!("evt_{n}"), "object": "event", "type": "payment_intent.succeeded", "created": an_hour_ago + n,
           "data": {"object": {"id": format!("pi_{n}"), "amount_received": 100 * n, "currency": "usd"}}})
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn reconcile_claims_exactly_the_missing_stripe_events_and_nothing_twice(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/events"))
        .and(query_param("starting_after", "evt_3"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(
                json!({"object": "list", "data": [stripe_event(2), stripe_event(1)], "has_more": false}),
            ),
        )
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/events"))
        .and(header("authorization", "Bearer sk_test_fake"))
        .and(query_param("delivery_success", "false"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"object": "list", "data": [stripe_event(5), stripe_event(4), stripe_event(3)], "has_more": true}),
        ))
        .with_priority(2)
        .mount(&server)
        .await;
    // evt_2 did arrive as a webhook.
    store(&pool, Provider::STRIPE, "evt_2", "payment_intent.succeeded", &stripe_event(2).to_string()).await;

    let api = StripeEvents::new(server.uri(), Secret::new("sk_test_fake")).unwrap();
    let first = api.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((first.fetched, first.applied, first.already_known), (5, 4, 1));
    let rows: Vec<(String, String, Option<i16>)> =
        sqlx::query_as("SELECT event_id, source, secret_index FROM webhook_inbox ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<(String, String, Option<i16>)> = (1..=5)
        .map(|n| {
            if n == 2 {
                ("evt_2".into(), "webhook".into(), Some(0))
            } else {
                (format!("evt_{n}"), "reconcile".into(), None)
            }
        })
        .collect();
    assert_eq!(rows, expected);

    let second = api.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((second.applied, second.already_known), (0, 5), "run twice, nothing twice");
    let checkpoint: i64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM checkpoint)::bigint FROM reconcile_checkpoints WHERE source = 'stripe:events'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now - 10..=now + 1).contains(&checkpoint), "the run's start: {checkpoint} vs {now}");
    let last = server.received_requests().await.unwrap().pop().unwrap();
    let asked: i64 =
        last.url.query_pairs().find(|(k, _)| k == "created[gte]").map(|(_, v)| v.parse().unwrap()).unwrap();
    assert!(
        (checkpoint - 301..=checkpoint - 299).contains(&asked),
        "the second run starts at the checkpoint less the overlap"
    );
}

/// The `created[gte]`/`created[lt]` (or `updated_at_min`/`_max`) of each request, in order.
async fn asked_windows(server: &MockServer, min: &str, max: &str) -> Vec<(String, String)> {
    let requests = server.received_requests().await.unwrap();
    let param =
        |r: &wiremock::Request, k: &str| r.url.query_pairs().find(|(key, _)| key == k).map(|(_, v)| v.into_owned());
    requests.iter().filter_map(|r| Some((param(r, min)?, param(r, max)?))).collect()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_long_lookback_is_walked_in_windows_saved_one_by_one_across_runs(pool: PgPool) {
    let server = MockServer::start().await;
    // A slow API: 150 ms a page, one page a window.
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_delay(std::time::Duration::from_millis(150))
                .set_body_json(json!({"data": [], "has_more": false})),
        )
        .mount(&server)
        .await;
    let config = ReconcileConfig {
        first_lookback: std::time::Duration::from_secs(24 * 3600),
        overlap: std::time::Duration::from_secs(300),
        window: std::time::Duration::from_secs(3600),
    };
    let api = StripeEvents::new(server.uri(), Secret::new("sk")).unwrap();
    let checkpoint = || async {
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT extract(epoch FROM checkpoint)::bigint FROM reconcile_checkpoints WHERE source = 'stripe:events'",
        )
        .fetch_optional(&pool)
        .await
        .unwrap()
        .flatten()
    };

    // A deadline too short for 25 windows: the run stops between pages, with what it finished saved.
    let first = api.reconcile(&pool, &config, std::time::Instant::now() + std::time::Duration::from_secs(1)).await;
    let first = first.unwrap();
    assert!(!first.finished);
    let asked = asked_windows(&server, "created[gte]", "created[lt]").await;
    assert!((2..=8).contains(&asked.len()), "a few windows in a second: {asked:?}");
    for pair in asked.windows(2) {
        assert_eq!(pair[0].1, pair[1].0, "each window starts where the last ended");
    }
    let saved = checkpoint().await.expect("the finished windows are saved");
    let last_finished: i64 = asked[asked.len() - 1].1.parse().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!(saved == last_finished || saved == last_finished - 3600, "{saved} vs {asked:?}");
    assert!(saved < now - 12 * 3600, "far from done: {saved}");

    // The next runs go on from there (less the overlap), and the last reaches the present.
    let seen = asked.len();
    let second = api.reconcile(&pool, &config, later()).await.unwrap();
    assert!(second.finished);
    let asked = asked_windows(&server, "created[gte]", "created[lt]").await;
    let resumed: i64 = asked[seen].0.parse().unwrap();
    assert_eq!(resumed, saved - 300);
    let reached: i64 = asked.last().unwrap().1.parse().unwrap();
    assert!((now - 5..=now + 70).contains(&reached), "up to the run's start: {reached} vs {now}");
    assert_eq!(checkpoint().await, Some(reached));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn reconcile_waits_out_a_429_as_the_api_asks(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "1.0"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [stripe_event(9)], "has_more": false})))
        .with_priority(2)
        .mount(&server)
        .await;
    let started = std::time::Instant::now();
    let found =
        StripeEvents::new(server.uri(), Secret::new("sk")).unwrap().reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!(found.applied, 1);
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
    assert!(started.elapsed() >= std::time::Duration::from_millis(900), "it waited for Retry-After");
}

fn order(id: u64, status: &str, updated_at: &str) -> Value {
    json!({"id": id, "customer": {"id": 42}, "financial_status": status, "total_price": "10.00", "updated_at": updated_at})
}

/// The stock handlers (`orders/updated` among them) over what reconcile claimed.
async fn drain(pool: &PgPool) {
    let worker = Worker::new(pool.clone(), stock::handlers(), inbox_tests::fast_worker_config());
    worker.run(later()).await.unwrap();
}

/// Each order is claimed as an `orders/updated` event, for the application's
/// handlers; the stock application's version guard then keeps the newest.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn reconcile_feeds_shopify_orders_to_the_handlers_as_orders_updated_events(pool: PgPool) {
    let server = MockServer::start().await;
    let next = format!("<{}/admin/api/2024-10/orders.json?page_info=p2&limit=250>; rel=\"next\"", server.uri());
    Mock::given(method("GET"))
        .and(path("/admin/api/2024-10/orders.json"))
        .and(query_param("page_info", "p2"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"orders": [order(3, "paid", "2026-11-29T10:00:00Z")]})),
        )
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/admin/api/2024-10/orders.json"))
        .and(header("x-shopify-access-token", "shpat_fake"))
        .and(query_param("status", "any"))
        .respond_with(ResponseTemplate::new(200).insert_header("Link", next.as_str()).set_body_json(
            json!({"orders": [order(1, "paid", "2026-11-29T09:00:00Z"), order(2, "pending", "2026-11-29T08:00:00Z")]}),
        ))
        .with_priority(2)
        .mount(&server)
        .await;
    // Order 2 is already known in a newer version: the fetched one is stale.
    sqlx::query("INSERT INTO orders VALUES ('2', '42', 'refunded', 10.00, '2026-11-29T11:00:00Z')")
        .execute(&pool)
        .await
        .unwrap();

    let api = ShopifyOrders::new(server.uri(), "2024-10", Secret::new("shpat_fake")).unwrap();
    let first = api.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((first.fetched, first.applied, first.already_known), (3, 3, 0));
    let events: Vec<(String, String, String)> =
        sqlx::query_as("SELECT event_id, event_type, source FROM webhook_inbox ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let event = |id: &str| (id.to_string(), "orders/updated".to_string(), "reconcile".to_string());
    assert_eq!(
        events,
        [
            event("reconcile:order:1:2026-11-29T09:00:00Z"),
            event("reconcile:order:2:2026-11-29T08:00:00Z"),
            event("reconcile:order:3:2026-11-29T10:00:00Z")
        ]
    );
    drain(&pool).await;
    let statuses: Vec<(String, String)> =
        sqlx::query_as("SELECT order_id, status FROM orders ORDER BY order_id").fetch_all(&pool).await.unwrap();
    assert_eq!(statuses, [("1".into(), "paid".into()), ("2".into(), "refunded".into()), ("3".into(), "paid".into())]);
    let expected: String = sqlx::query_scalar(
        "SELECT to_char((checkpoint - interval '5 minutes') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') FROM reconcile_checkpoints WHERE source = 'shopify:orders'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let second = api.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((second.applied, second.already_known), (0, 3), "run twice, nothing twice");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 3);
    let last = server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.url.query().unwrap_or("").contains("updated_at_min"))
        .last()
        .unwrap();
    let asked = last.url.query_pairs().find(|(k, _)| k == "updated_at_min").map(|(_, v)| v.into_owned()).unwrap();
    assert_eq!(asked, expected, "the second run asks from the checkpoint less the overlap");
}

// ---------- one bad event fails only itself ----------

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_stripe_event_postgres_or_our_check_refuses_is_kept_failed_and_the_page_goes_on(pool: PgPool) {
    let server = MockServer::start().await;
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let good = stripe_event(3);
    // Raw text: the page is not valid for serde_json::Value, as a provider's API may send it.
    let page = format!(
        r#"{{"object":"list","has_more":false,"data":[{},{{"id":"evt_2","type":"x","created":1,"data":{{"note":"\ud800"}}}},{{"id":"evt_deep","type":"x","created":1,"data":{deep}}},{good}]}}"#,
        stripe_event(1)
    );
    Mock::given(method("GET"))
        .and(path("/v1/events"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(page, "application/json"))
        .mount(&server)
        .await;
    let api = StripeEvents::new(server.uri(), Secret::new("sk_test_fake")).unwrap();
    let found = api.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((found.fetched, found.applied, found.failed), (4, 2, 2));
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT event_id, status, source FROM webhook_inbox ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expect = |id: &str, status: &str| (id.to_string(), status.to_string(), "reconcile".to_string());
    assert_eq!(
        rows,
        [
            expect("evt_1", "pending"),
            expect("evt_2", "failed"),
            expect("evt_3", "pending"),
            expect("evt_deep", "failed")
        ]
    );
    let checkpoints: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reconcile_checkpoints").fetch_one(&pool).await.unwrap();
    assert_eq!(checkpoints, 1, "the checkpoint moved");
}

/// An order without an id or `updated_at` is kept failed at once; one the
/// handler cannot apply fails alone in the worker; the others flow.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_shopify_order_that_cannot_be_applied_is_kept_failed_and_the_page_goes_on(pool: PgPool) {
    let server = MockServer::start().await;
    let huge_total = json!({"id": 2, "financial_status": "paid", "total_price": "100000000000000000000.00", "updated_at": "2026-11-29T09:00:00Z"});
    let bad_time =
        json!({"id": 3, "financial_status": "paid", "total_price": "1.00", "updated_at": "the 32nd of Smarch"});
    let no_id = json!({"financial_status": "paid", "total_price": "1.00", "updated_at": "2026-11-29T09:00:00Z"});
    Mock::given(method("GET"))
        .and(path("/admin/api/2024-10/orders.json"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"orders": [order(1, "paid", "2026-11-29T09:00:00Z"), huge_total, bad_time, no_id, order(5, "paid", "2026-11-29T09:30:00Z")]}),
        ))
        .mount(&server)
        .await;
    let api = ShopifyOrders::new(server.uri(), "2024-10", Secret::new("shpat_fake")).unwrap();
    let found = api.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((found.fetched, found.applied, found.failed), (5, 4, 1));
    drain(&pool).await;
    let orders: Vec<String> =
        sqlx::query_scalar("SELECT order_id FROM orders ORDER BY 1").fetch_all(&pool).await.unwrap();
    assert_eq!(orders, ["1", "5"]);
    let failed: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT event_type, source, failure_reason FROM webhook_inbox WHERE status = 'failed' ORDER BY failure_reason",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let types: Vec<&str> = failed.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(types, ["orders/updated", "orders/updated", "reconcile:order"]);
    assert!(failed.iter().all(|(_, source, _)| source == "reconcile"));
    let reasons: Vec<&str> = failed.iter().map(|f| f.2.as_str()).collect();
    assert!(
        reasons[0].contains("invalid input syntax") && reasons[1].contains("numeric field overflow"),
        "{reasons:?}"
    );
    assert!(reasons[2].contains("malformed order: no id"), "{reasons:?}");
    // Run again: every order is a duplicate, not a new row.
    let again = api.reconcile(&pool, &config(), later()).await.unwrap();
    assert_eq!((again.applied, again.failed), (0, 1));
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(rows, 5);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_shopify_next_link_to_another_host_is_not_followed(pool: PgPool) {
    let shop = MockServer::start().await;
    let elsewhere = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"orders": []})))
        .mount(&elsewhere)
        .await;
    let link = format!("<{}/admin/api/2024-10/orders.json?page_info=p2>; rel=\"next\"", elsewhere.uri());
    Mock::given(method("GET"))
        .and(path("/admin/api/2024-10/orders.json"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("Link", link.as_str())
                .set_body_json(json!({"orders": [order(1, "paid", "2026-11-29T09:00:00Z")]})),
        )
        .mount(&shop)
        .await;
    let api = ShopifyOrders::new(shop.uri(), "2024-10", Secret::new("shpat_fake")).unwrap();
    let err = api.reconcile(&pool, &config(), later()).await.unwrap_err();
    assert!(err.to_string().contains("another host"), "{err}");
    assert!(!err.to_string().contains("shpat_fake"));
    assert!(elsewhere.received_requests().await.unwrap().is_empty(), "the token never left for another host");
    let checkpoints: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reconcile_checkpoints").fetch_one(&pool).await.unwrap();
    assert_eq!(checkpoints, 0, "a run that could not finish leaves the checkpoint where it was");
}

/// The run both the Lambda and `inbox reconcile` report: each source on its own.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_run_reports_each_source_and_one_failing_does_not_stop_the_other(pool: PgPool) {
    let stripe = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/events"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"object": "list", "data": [stripe_event(1)], "has_more": false})),
        )
        .mount(&stripe)
        .await;
    let shopify = MockServer::start().await;
    Mock::given(method("GET")).respond_with(ResponseTemplate::new(500).set_body_string("down")).mount(&shopify).await;
    let reconciler = Reconciler::new(pool.clone(), config())
        .with_source(std::sync::Arc::new(StripeEvents::new(stripe.uri(), Secret::new("sk_test_fake")).unwrap()))
        .with_source(std::sync::Arc::new(
            ShopifyOrders::new(shopify.uri(), "2024-10", Secret::new("shpat_fake")).unwrap(),
        ));
    let reconciled = reconciler.run_once(later()).await;
    assert_eq!(reconciled.sources["stripe events"].applied, 1);
    assert!(reconciled.failed["shopify orders"].contains("HTTP 500"), "{reconciled:?}");
    let report = serde_json::to_value(&reconciled).unwrap();
    assert_eq!(report["sources"]["stripe events"]["fetched"], 1);
}
