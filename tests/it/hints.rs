//! Events as hints, against a real PostgreSQL and a fake Stripe API
//! (wiremock): the stock `customer.subscription.*` handler keeps the
//! subscription the API answers, fetched by the worker outside any
//! transaction.

use std::{sync::Arc, time::Duration};

use inbox_tests::{fast_worker_config, later, store};
use serde_json::{json, Value};
use sqlx::PgPool;
use webhook_inbox::{
    config::Secret,
    hints::{Apis, StripeApi},
    Provider, Worker, WorkerConfig,
};
use wiremock::{
    matchers::{header, method, path},
    Mock, MockServer, ResponseTemplate,
};

/// A `customer.subscription.updated` event whose payload says `status`.
fn event(event_id: &str, sub: &str, status: &str) -> String {
    json!({"id": event_id, "object": "event", "type": "customer.subscription.updated", "created": 1,
           "data": {"object": {"id": sub, "object": "subscription", "status": status, "customer": "cus_payload"}}})
    .to_string()
}

/// The subscription as the API answers.
fn subscription(sub: &str, status: &str) -> Value {
    json!({"id": sub, "object": "subscription", "status": status, "customer": "cus_1",
           "items": {"object": "list", "data": [{"id": "si_1", "current_period_end": 1_800_000_000}]}})
}

fn worker(pool: &PgPool, api: StripeApi, config: WorkerConfig) -> Worker {
    Worker::new(pool.clone(), stock::handlers(), config)
        .with_apis(Apis::default().with(Provider::STRIPE, Arc::new(api)))
}

async fn stripe_at(server: &MockServer) -> StripeApi {
    StripeApi::with_timeout(server.uri(), Secret::new("sk_test_hint"), Duration::from_millis(300)).unwrap()
}

async fn row(pool: &PgPool, sub: &str) -> Option<(String, Option<String>, Option<i64>)> {
    sqlx::query_as(
        "SELECT status, customer_id, extract(epoch FROM current_period_end)::bigint FROM subscriptions WHERE subscription_id = $1",
    )
    .bind(sub)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn inbox(pool: &PgPool, event_id: &str) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT status, attempts, failure_reason FROM webhook_inbox WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_subscription_event_whose_payload_disagrees_with_the_api_ends_with_the_apis_state(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions/sub_1"))
        .and(header("authorization", "Bearer sk_test_hint"))
        .respond_with(ResponseTemplate::new(200).set_body_json(subscription("sub_1", "past_due")))
        .expect(1)
        .mount(&server)
        .await;
    store(&pool, Provider::STRIPE, "evt_1", "customer.subscription.updated", &event("evt_1", "sub_1", "active")).await;
    // Around it, events of other handlers flow in the same batch.
    let payment = json!({"id": "evt_pay", "type": "payment_intent.succeeded",
                         "data": {"object": {"id": "pi_1", "amount_received": 500, "currency": "usd"}}});
    store(&pool, Provider::STRIPE, "evt_pay", "payment_intent.succeeded", &payment.to_string()).await;

    let counts = worker(&pool, stripe_at(&server).await, fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((counts.taken, counts.applied), (2, 2), "{counts:?}");
    assert_eq!(
        row(&pool, "sub_1").await,
        Some(("past_due".into(), Some("cus_1".into()), Some(1_800_000_000))),
        "the API's state, not the payload's"
    );
    assert_eq!(inbox(&pool, "evt_1").await, ("done".into(), 1, None));
    assert_eq!(inbox(&pool, "evt_pay").await.0, "done");
}

/// Two events of one subscription, two workers: the first fetch is asked
/// first and answered last, with the older state. The newer state stays.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn racing_fetches_of_one_object_leave_the_newer_state(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions/sub_r"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_delay(Duration::from_millis(1500))
                .set_body_json(subscription("sub_r", "active")),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions/sub_r"))
        .respond_with(ResponseTemplate::new(200).set_body_json(subscription("sub_r", "canceled")))
        .mount(&server)
        .await;
    store(&pool, Provider::STRIPE, "evt_r1", "customer.subscription.updated", &event("evt_r1", "sub_r", "active"))
        .await;
    store(&pool, Provider::STRIPE, "evt_r2", "customer.subscription.deleted", &event("evt_r2", "sub_r", "canceled"))
        .await;
    let one_at_a_time = WorkerConfig { batch_size: 1, ..fast_worker_config() };
    let slow = StripeApi::with_timeout(server.uri(), Secret::new("sk"), Duration::from_secs(5)).unwrap();
    let first = worker(&pool, slow, one_at_a_time.clone());
    let second = worker(&pool, stripe_at(&server).await, one_at_a_time);
    let first = tokio::spawn(async move { first.run_once(later()).await.unwrap() });
    // The first worker has asked (its answer is on its way, slowly) before the second asks.
    for _ in 0..100 {
        if !server.received_requests().await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let newer = second.run_once(later()).await.unwrap();
    assert_eq!((newer.taken, newer.applied), (1, 1), "the second worker took evt_r2 and applied the newer state");
    assert_eq!(row(&pool, "sub_r").await.unwrap().0, "canceled");
    let older = first.await.unwrap();
    assert_eq!((older.taken, older.applied, older.no_effect), (1, 0, 1), "the older answer changed nothing: {older:?}");
    assert_eq!(row(&pool, "sub_r").await.unwrap().0, "canceled", "the newer state stays");
    assert_eq!((inbox(&pool, "evt_r1").await.0, inbox(&pool, "evt_r2").await.0), ("done".into(), "done".into()));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_fetch_that_times_out_leaves_the_event_pending_and_a_later_pass_applies_it(pool: PgPool) {
    let server = MockServer::start().await;
    // Every try of the first pass (three) times out.
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions/sub_t"))
        .respond_with(
            ResponseTemplate::new(200).set_delay(Duration::from_secs(2)).set_body_json(subscription("sub_t", "active")),
        )
        .up_to_n_times(3)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions/sub_t"))
        .respond_with(ResponseTemplate::new(200).set_body_json(subscription("sub_t", "trialing")))
        .mount(&server)
        .await;
    store(&pool, Provider::STRIPE, "evt_t", "customer.subscription.created", &event("evt_t", "sub_t", "incomplete"))
        .await;
    let w = worker(&pool, stripe_at(&server).await, fast_worker_config());
    let first = w.run_once(later()).await.unwrap();
    assert_eq!((first.taken, first.retried), (1, 1), "{first:?}");
    let (status, attempts, reason) = inbox(&pool, "evt_t").await;
    assert_eq!((status.as_str(), attempts), ("pending", 1));
    let reason = reason.unwrap();
    assert!(reason.contains("GET /v1/subscriptions/sub_t timed out"), "{reason}");
    assert_eq!(row(&pool, "sub_t").await, None, "nothing applied");
    assert_eq!(server.received_requests().await.unwrap().len(), 3, "three tries");

    tokio::time::sleep(Duration::from_millis(50)).await; // its backoff (1 ms base)
    let second = w.run_once(later()).await.unwrap();
    assert_eq!(second.applied, 1, "{second:?}");
    assert_eq!(row(&pool, "sub_t").await.unwrap().0, "trialing");
    assert_eq!(inbox(&pool, "evt_t").await, ("done".into(), 2, None));
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_object_the_api_does_not_have_fails_its_event_with_the_reason_and_the_others_flow(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions/sub_gone"))
        .respond_with(ResponseTemplate::new(404).set_body_json(
            json!({"error": {"message": "No such subscription: 'sub_gone'", "type": "invalid_request_error"}}),
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions/sub_ok"))
        .respond_with(ResponseTemplate::new(200).set_body_json(subscription("sub_ok", "active")))
        .mount(&server)
        .await;
    store(
        &pool,
        Provider::STRIPE,
        "evt_gone",
        "customer.subscription.updated",
        &event("evt_gone", "sub_gone", "active"),
    )
    .await;
    // A hostile id: never a path of its own at the API.
    store(
        &pool,
        Provider::STRIPE,
        "evt_evil",
        "customer.subscription.updated",
        &event("evt_evil", "../../v1/charges?x=1", "active"),
    )
    .await;
    store(&pool, Provider::STRIPE, "evt_ok", "customer.subscription.updated", &event("evt_ok", "sub_ok", "active"))
        .await;
    let counts = worker(&pool, stripe_at(&server).await, fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((counts.taken, counts.applied, counts.failed), (3, 1, 2), "{counts:?}");
    let (status, _, reason) = inbox(&pool, "evt_gone").await;
    assert_eq!(status, "failed");
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("HTTP 404") && r.contains("No such subscription")),
        "{reason:?}"
    );
    let (status, _, reason) = inbox(&pool, "evt_evil").await;
    assert_eq!(status, "failed");
    assert!(reason.as_deref().is_some_and(|r| r.contains("not a Stripe object id")), "{reason:?}");
    assert_eq!(row(&pool, "sub_ok").await.unwrap().0, "active");
    let paths: Vec<String> =
        server.received_requests().await.unwrap().iter().map(|r| r.url.path().to_string()).collect();
    assert_eq!(paths.len(), 2, "the hostile id was never sent: {paths:?}");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn without_an_api_the_event_stays_pending_and_says_why(pool: PgPool) {
    store(&pool, Provider::STRIPE, "evt_n", "customer.subscription.updated", &event("evt_n", "sub_n", "active")).await;
    let w = Worker::new(pool.clone(), stock::handlers(), fast_worker_config());
    let counts = w.run_once(later()).await.unwrap();
    assert_eq!(counts.retried, 1, "{counts:?}");
    let (status, attempts, reason) = inbox(&pool, "evt_n").await;
    assert_eq!((status.as_str(), attempts), ("pending", 1));
    assert!(reason.as_deref().is_some_and(|r| r.contains("STRIPE_API_KEY")), "{reason:?}");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn an_object_over_16_mib_fails_its_event_unread_and_the_others_flow(pool: PgPool) {
    let server = MockServer::start().await;
    let mut huge = subscription("sub_huge", "active");
    huge["metadata"] = json!({"pad": "x".repeat(17 << 20)});
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions/sub_huge"))
        .respond_with(ResponseTemplate::new(200).set_body_json(huge))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/subscriptions/sub_ok"))
        .respond_with(ResponseTemplate::new(200).set_body_json(subscription("sub_ok", "active")))
        .mount(&server)
        .await;
    let huge_event = event("evt_huge", "sub_huge", "active");
    store(&pool, Provider::STRIPE, "evt_huge", "customer.subscription.updated", &huge_event).await;
    store(&pool, Provider::STRIPE, "evt_ok", "customer.subscription.updated", &event("evt_ok", "sub_ok", "active"))
        .await;
    let api = StripeApi::with_timeout(server.uri(), Secret::new("sk_test_hint"), Duration::from_secs(10)).unwrap();
    let counts = worker(&pool, api, fast_worker_config()).run_once(later()).await.unwrap();
    assert_eq!((counts.taken, counts.applied, counts.failed), (2, 1, 1), "{counts:?}");
    let (status, _, reason) = inbox(&pool, "evt_huge").await;
    assert_eq!(status, "failed");
    assert!(reason.as_deref().is_some_and(|r| r.contains("over 16 MiB")), "{reason:?}");
    assert_eq!(row(&pool, "sub_ok").await.unwrap().0, "active");
}
