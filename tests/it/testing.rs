//! The public test support (`webhook_inbox::testing`) as a team uses it: each
//! provider's signed delivery is accepted by the real receive path with the
//! same secret, and refused when its body is not the one signed.

use sqlx::PgPool;
use webhook_inbox::{
    config::DEV_STANDARD,
    testing::{self, TestInbox},
    App, Handlers,
};

#[sqlx::test(migrations = false)]
async fn each_signer_signs_as_its_provider_verifies(pool: PgPool) {
    let env = [
        ("STRIPE_WEBHOOK_SECRET", "whsec_t"),
        ("SHOPIFY_WEBHOOK_SECRET", "shpss_t"),
        ("GITHUB_WEBHOOK_SECRET", "gh_t"),
        ("STANDARD_WEBHOOK_SECRET", DEV_STANDARD),
    ];
    let inbox = TestInbox::new(&pool, &App::new(Handlers::new()), &env).await.unwrap();
    let body = |id: &str| format!(r#"{{"id":"{id}","type":"thing.happened","data":{{}}}}"#);
    let signed = [
        testing::stripe("whsec_t", &body("evt_1")),
        testing::shopify("shpss_t", "wh_1", "orders/paid", &body("1")),
        testing::github("gh_t", "gh-delivery-1", "issues", &body("1")),
        testing::standard(DEV_STANDARD, "msg_1", &body("1")),
    ];
    for request in signed {
        let provider = request.uri().path().to_string();
        let answer = inbox.deliver(request).await;
        assert_eq!((answer.status, answer.body["status"].as_str()), (200, Some("accepted")), "{provider}: {answer:?}");
    }
    // Signed for one body, sent with another: refused, nothing stored.
    let forged = [
        testing::stripe("whsec_t", &body("evt_2")),
        testing::shopify("shpss_t", "wh_2", "orders/paid", &body("2")),
        testing::github("gh_t", "gh-delivery-2", "issues", &body("2")),
        testing::standard(DEV_STANDARD, "msg_2", &body("2")),
    ];
    for request in forged {
        let (parts, _) = request.into_parts();
        let provider = parts.uri.path().to_string();
        let request = http::Request::from_parts(parts, lambda_http::Body::from(body("other")));
        assert_eq!(inbox.deliver(request).await.status, 401, "{provider}");
    }
    let drained = inbox.drain().await.unwrap();
    assert_eq!((drained.taken, drained.unhandled), (4, 4), "{drained:?}");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(inbox.pool()).await.unwrap();
    assert_eq!(stored, 4);
}

/// A provider named as a handler is registered (`"stripe"`) or as a `Provider`: the same event.
#[test]
fn an_event_names_its_provider_as_handlers_do() {
    let by_name = testing::event("stripe", "evt_1", "invoice.paid", ());
    assert_eq!(by_name.provider, webhook_inbox::Provider::STRIPE);
    let refused = std::panic::catch_unwind(|| testing::event("Not A Provider", "evt_1", "invoice.paid", ()));
    let said = refused.err().and_then(|p| p.downcast::<String>().ok()).map(|s| *s).unwrap_or_default();
    assert!(said.contains("\"Not A Provider\" is not a provider name"), "{said:?}");
}

#[test]
fn an_event_for_a_handler_test_is_fresh_and_its_fields_are_the_tests() {
    let mut event = testing::event(webhook_inbox::Provider::STRIPE, "evt_1", "invoice.paid", 7);
    assert_eq!(
        (event.event_id.as_str(), event.event_type.as_str(), event.payload, event.attempts),
        ("evt_1", "invoice.paid", 7, 0)
    );
    event.attempts = 3;
    event.headers = [("X-Shopify-Topic", "orders/paid")].into_iter().collect();
    assert_eq!(event.headers.get("x-shopify-topic"), Some("orders/paid"));
}
