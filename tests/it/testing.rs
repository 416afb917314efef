//! The public test support (`webhook_inbox::testing`) as a team uses it: each
//! provider's signed delivery is accepted by the real receive path with the
//! same secret, and refused when its body is not the one signed.

use sqlx::PgPool;
use webhook_inbox::{
    config::{Catalog, Env, DEV_STANDARD},
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

/// `testing::declared` signs as each contract written as data says: a
/// timestamp in its own header (Slack, Unix seconds; Twitch, RFC 3339;
/// HubSpot, milliseconds, with its method and URL), in the signature header
/// (Paddle), in the body (Linear), and a team's own provider from its
/// providers file; each accepted by the real receive path, and refused under
/// another secret.
#[sqlx::test(migrations = false)]
async fn a_declared_provider_is_signed_as_its_contract_says(pool: PgPool) {
    let acme = r#"[acme]
signature = { header = "X-Acme-Signature", prefix = "sha256=" }
encoding = "hex"
signed = "{timestamp}.{body}"
timestamp = { from = "{header:X-Acme-Timestamp}", format = "unix", tolerance_secs = 300 }
event_id = "{json:/id}"
event_type = "{json:/type}"
redelivery_days = 3
"#;
    let env = [
        ("SLACK_WEBHOOK_SECRET", "slack-secret"),
        ("TWITCH_WEBHOOK_SECRET", "twitch-secret"),
        ("HUBSPOT_WEBHOOK_SECRET", "hubspot-secret"),
        ("HUBSPOT_WEBHOOK_URL", "https://hooks.example.com/webhooks/hubspot"),
        ("PADDLE_WEBHOOK_SECRET", "pdl_ntfset_secret"),
        ("LINEAR_WEBHOOK_SECRET", "linear-secret"),
        ("ACME_WEBHOOK_SECRET", "acme-secret"),
        ("INBOX_PROVIDERS", acme),
    ];
    let catalog = Catalog::read(&Env::from_pairs(&env)).unwrap();
    let inbox = TestInbox::new(&pool, &App::new(Handlers::new()), &env).await.unwrap();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    // A provider, its secret, the delivery's other headers, its body.
    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, String);
    let cases: [Case; 6] = [
        ("slack", "slack-secret", vec![], r#"{"event_id":"Ev1","type":"event_callback"}"#.into()),
        (
            "twitch",
            "twitch-secret",
            vec![("Twitch-Eventsub-Message-Id", "tw-1"), ("Twitch-Eventsub-Subscription-Type", "channel.follow")],
            "{}".into(),
        ),
        ("hubspot", "hubspot-secret", vec![], r#"[{"eventId":1,"subscriptionType":"contact.creation"}]"#.into()),
        ("paddle", "pdl_ntfset_secret", vec![], r#"{"event_id":"evt_p1","event_type":"transaction.paid"}"#.into()),
        (
            "linear",
            "linear-secret",
            vec![("Linear-Delivery", "lin-1"), ("Linear-Event", "Issue")],
            format!(r#"{{"webhookTimestamp":{now_ms},"type":"Issue"}}"#),
        ),
        ("acme", "acme-secret", vec![], r#"{"id":"ac_1","type":"thing.happened"}"#.into()),
    ];
    for (provider, secret, headers, body) in &cases {
        let signed = testing::declared(&catalog, provider, secret, headers, body).unwrap();
        let answer = inbox.deliver(signed).await;
        assert_eq!(answer.status, 200, "{provider}: {answer:?}");
        let other = testing::declared(&catalog, provider, "another-secret", headers, body).unwrap();
        assert_eq!(inbox.deliver(other).await.status, 401, "{provider} under another secret");
    }
    let refused = testing::declared(&catalog, "stripe", "whsec_t", &[], "{}").unwrap_err();
    assert!(refused.contains("not declared as data"), "{refused}");
    assert!(testing::declared(&catalog, "nobody", "s", &[], "{}").unwrap_err().contains("not a provider known here"));
}

/// A team tries its ignore rules with the test kit: given as `INBOX_RULES`,
/// the events they match end `ignored` and `drain()` counts them.
#[sqlx::test(migrations = false)]
async fn a_team_s_ignore_rules_apply_in_the_test_kit(pool: PgPool) {
    let rules = "[[ignore]]\nprovider = \"github\"\ntype = \"ping\"\n";
    let env = [("GITHUB_WEBHOOK_SECRET", "gh_t"), ("INBOX_RULES", rules)];
    let inbox = TestInbox::new(&pool, &App::new(Handlers::new()), &env).await.unwrap();
    for (id, kind) in [("gh-1", "ping"), ("gh-2", "issues")] {
        assert_eq!(inbox.deliver(testing::github("gh_t", id, kind, "{}")).await.status, 200);
    }
    let drained = inbox.drain().await.unwrap();
    assert_eq!((drained.taken, drained.ignored, drained.unhandled), (2, 1, 1), "{drained:?}");
    let ping = webhook_inbox::ops::stored_event(inbox.pool(), "github", "gh-1").await.unwrap().unwrap();
    assert_eq!(ping.status, webhook_inbox::ops::Status::Ignored);
}

/// A team seeds events without signing them: `store` claims each as receive
/// would, once (the same event again changes nothing), and the real worker
/// takes them, the team's handler applying each.
#[sqlx::test(migrations = false)]
async fn stored_events_are_claimed_once_and_the_worker_applies_them(pool: PgPool) {
    use webhook_inbox::{
        ops::{rfc3339, Status},
        Event, HandlerError, Outcome, PgConnection, Provider,
    };
    async fn seen(_: &mut PgConnection, _: &Event) -> Result<Outcome, HandlerError> {
        Ok(Outcome::Applied)
    }
    let app = App::new(Handlers::new().on(Provider::STRIPE, "invoice.paid", seen).unwrap());
    let inbox = TestInbox::new(&pool, &app, &[]).await.unwrap();
    for id in ["evt_1", "evt_2"] {
        let payload = format!(r#"{{"id":"{id}","type":"invoice.paid"}}"#);
        assert!(testing::store(inbox.pool(), Provider::STRIPE, id, "invoice.paid", &payload).await.unwrap(), "{id}");
    }
    assert!(!testing::store(inbox.pool(), Provider::STRIPE, "evt_1", "invoice.paid", "{}").await.unwrap());
    let drained = inbox.drain().await.unwrap();
    assert_eq!((drained.taken, drained.applied), (2, 2), "{drained:?}");
    let first = webhook_inbox::ops::stored_event(inbox.pool(), "stripe", "evt_1").await.unwrap().unwrap();
    let id = first.payload.as_ref().and_then(|p| p.0["id"].as_str());
    assert_eq!((first.status, id), (Status::Done, Some("evt_1")), "the first payload is kept");
    // Its times are times, the same instants PostgreSQL holds, written as the API writes them.
    let (received, processed): (String, String) = sqlx::query_as(
        "SELECT to_json(received_at)#>>'{}', to_json(processed_at)#>>'{}' FROM webhook_inbox WHERE event_id = 'evt_1'",
    )
    .fetch_one(inbox.pool())
    .await
    .unwrap();
    let processed_at = first.processed_at.expect("a done event was processed");
    assert_eq!((rfc3339(first.received_at), rfc3339(processed_at)), (received, processed));
    assert!(processed_at >= first.received_at);
    // Its Debug, as a failing assertion prints it: the bytes as text, not as numbers.
    let shown = format!("{first:?}");
    assert!(shown.contains(r#"raw_body: 36 bytes: "{\"id\":\"evt_1\",\"type\":\"invoice.paid\"}""#), "{shown}");
}

/// `drain()` runs until nothing is pending; with an event that cannot be
/// processed (its provider paused) it gives up after 30 s, saying how many
/// are left and where to look, rather than answer as if it had drained.
#[sqlx::test(migrations = false)]
async fn drain_says_when_it_gives_up_with_events_still_pending(pool: PgPool) {
    use webhook_inbox::ops::{self, Audit, PauseScope};
    let inbox =
        TestInbox::new(&pool, &App::new(Handlers::new()), &[("STRIPE_WEBHOOK_SECRET", "whsec_t")]).await.unwrap();
    let by = Audit { actor: "test", action: "pause", reason: "held for the test" };
    let scope = PauseScope::new("stripe", None).unwrap();
    ops::pause_events(&pool, &scope, std::time::Duration::from_secs(3600), &by).await.unwrap();
    let body = r#"{"id":"evt_held","type":"invoice.paid","data":{}}"#;
    assert_eq!(inbox.deliver(testing::stripe("whsec_t", body)).await.status, 200);
    let err = inbox.drain().await.unwrap_err();
    assert!(matches!(err, testing::TestInboxError::StillPending { pending: 1, .. }), "{err}");
    assert!(err.to_string().starts_with("1 event(s) still pending after 30s of draining"), "{err}");
}

/// A relay test with the kit's `RecordingSink`: a team's handler enqueues a
/// receipt for its own sink; the sink, told to refuse once, sees the message
/// twice under one key and takes it the second time, and the outbox says sent.
#[sqlx::test(migrations = false)]
async fn a_recording_sink_sees_what_the_relay_hands_it_and_answers_as_told(pool: PgPool) {
    use webhook_inbox::{
        sinks::SinkReply, testing::RecordingSink, Event, HandlerError, Message, Outcome, PgConnection, Provider,
    };
    async fn receipt(conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        let id = event.payload["data"]["object"]["id"].as_str().unwrap_or_default().to_string();
        let m = Message::new("invoice", &id, format!("receipt:{id}"), serde_json::json!({ "invoice": id }));
        event.enqueue(conn, &m.to("billing")).await?;
        Ok(Outcome::Applied)
    }
    let billing = RecordingSink::new();
    let app = App::new(Handlers::new().on(Provider::STRIPE, "invoice.paid", receipt).unwrap())
        .with_sink("billing", billing.clone());
    let env =
        [("STRIPE_WEBHOOK_SECRET", "whsec_t"), ("RELAY_DESTINATIONS", "[destination.billing]\nsink = \"billing\"")];
    let inbox = TestInbox::new(&pool, &app, &env).await.unwrap();
    let body = r#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"id":"in_1"}}}"#;
    assert_eq!(inbox.deliver(testing::stripe("whsec_t", body)).await.status, 200);
    assert_eq!(inbox.drain().await.unwrap().applied, 1);
    billing.answer_next(SinkReply::retry("down for a moment"));
    inbox.relay().await.unwrap();
    assert!(billing.delivered().is_empty(), "refused once");
    sqlx::query("UPDATE transactional_outbox SET next_attempt_at = now()").execute(&pool).await.unwrap();
    inbox.relay().await.unwrap();
    let handed = billing.handed();
    let keys: Vec<(&str, bool)> =
        handed.iter().map(|(m, r)| (m.message_key.as_str(), *r == SinkReply::Delivered)).collect();
    assert_eq!(keys, [("receipt:in_1", false), ("receipt:in_1", true)]);
    let sent = billing.delivered();
    assert_eq!((sent[0].payload.0["invoice"].as_str(), sent[0].attempts), (Some("in_1"), 2));
    let unsent: i64 = sqlx::query_scalar("SELECT count(*) FROM transactional_outbox WHERE processed_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(unsent, 0);
}

/// The kit's bodies, signed by its signers, are what receive takes: a Stripe
/// event, a Standard Webhooks payload and a Marqeta batch of two, each stored
/// under the id and type its provider gives it; a Marqeta delivery without the
/// signature its secret asks for is refused.
#[sqlx::test(migrations = false)]
async fn the_kit_s_bodies_are_stored_under_their_provider_s_ids_and_types(pool: PgPool) {
    use webhook_inbox::{serde_json::json, testing::bodies};
    let env = [
        ("STRIPE_WEBHOOK_SECRET", "whsec_t"),
        ("STANDARD_WEBHOOK_SECRET", DEV_STANDARD),
        ("MARQETA_WEBHOOK_USERNAME", "mq"),
        ("MARQETA_WEBHOOK_PASSWORD", "a-password-at-least-20-long"),
        ("MARQETA_WEBHOOK_SECRET", "mq-signing"),
    ];
    let inbox = TestInbox::new(&pool, &App::new(Handlers::new()), &env).await.unwrap();
    let stripe = bodies::stripe_event("evt_1", "invoice.paid", json!({"id": "in_1", "object": "invoice"}));
    assert_eq!(inbox.deliver(testing::stripe("whsec_t", &stripe)).await.status, 200);
    let standard = bodies::standard_event("user.created", json!({"id": "u_1"}));
    assert_eq!(inbox.deliver(testing::standard(DEV_STANDARD, "msg_1", &standard)).await.status, 200);
    let items = [json!({"token": "t1", "type": "authorization"}), json!({"token": "t2", "type": "refund"})];
    let batch = bodies::marqeta_batch("transactions", &items);
    assert_eq!(
        inbox.deliver(testing::marqeta("mq", "a-password-at-least-20-long", None, &batch)).await.status,
        401,
        "no signature"
    );
    assert_eq!(
        inbox.deliver(testing::marqeta("mq", "a-password-at-least-20-long", Some("mq-signing"), &batch)).await.status,
        200
    );
    let stored: Vec<(String, String, String)> =
        sqlx::query_as("SELECT provider, event_id, event_type FROM webhook_inbox ORDER BY event_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let stored: Vec<(&str, &str, &str)> = stored.iter().map(|(p, i, t)| (p.as_str(), i.as_str(), t.as_str())).collect();
    assert_eq!(
        stored,
        [
            ("stripe", "evt_1", "invoice.paid"),
            ("standard", "msg_1", "user.created"),
            ("marqeta", "transactions:t1", "transactions:authorization"),
            ("marqeta", "transactions:t2", "transactions:refund"),
        ]
    );
    let body: serde_json::Value = serde_json::from_str(&standard).unwrap();
    let stamp = body["timestamp"].as_str().unwrap();
    assert!(stamp.len() == 20 && stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T', "{stamp}");
}

/// The kit's assertions, as a team's test uses them: the event's status and
/// what its handler enqueued, and, when either is not what the test requires,
/// a failure that says what there is instead.
#[sqlx::test(migrations = false)]
async fn the_kit_requires_a_status_and_what_a_handler_enqueued_and_says_what_there_is(pool: PgPool) {
    use futures_util::FutureExt as _;
    use std::panic::AssertUnwindSafe;
    use webhook_inbox::{
        ops::Status, serde_json::json, testing::Enqueued, Event, HandlerError, Message, Outcome, PgConnection, Provider,
    };
    async fn paid(conn: &mut PgConnection, e: &Event) -> Result<Outcome, HandlerError> {
        let invoice = e.payload["data"]["object"]["id"].as_str().unwrap_or_default();
        let receipt = Message::new("invoice", invoice, format!("receipt:{invoice}"), json!({"invoice": invoice}));
        e.enqueue(conn, &receipt.to("billing")).await?;
        Ok(Outcome::Applied)
    }
    async fn voided(_: &mut PgConnection, _: &Event) -> Result<Outcome, HandlerError> {
        Err(HandlerError::Permanent("voided invoices are not ours".into()))
    }
    let handlers = Handlers::new().on(Provider::STRIPE, "invoice.paid", paid).unwrap();
    let app = App::new(handlers.on(Provider::STRIPE, "invoice.voided", voided).unwrap());
    let inbox = TestInbox::new(&pool, &app, &[("STRIPE_WEBHOOK_SECRET", "whsec_t")]).await.unwrap();
    let paid = testing::bodies::stripe_event("evt_1", "invoice.paid", json!({"id": "in_1"}));
    let voided = testing::bodies::stripe_event("evt_2", "invoice.voided", json!({"id": "in_2"}));
    for body in [paid, voided] {
        assert_eq!(inbox.deliver(testing::stripe("whsec_t", &body)).await.status, 200);
    }
    inbox.drain().await.unwrap();

    assert_eq!(inbox.require_status("stripe", "evt_1", Status::Done).await.attempts, 1);
    let sent = inbox.require_enqueued("stripe", "evt_1", "billing").await;
    let expected = Enqueued {
        message_key: "receipt:in_1".into(),
        destination: "billing".into(),
        aggregate_type: "invoice".into(),
        aggregate_id: "in_1".into(),
        ordering_key: None,
        payload: json!({"invoice": "in_1"}),
    };
    assert_eq!(sent, [expected]);
    inbox.require_nothing_enqueued("stripe", "evt_2").await;

    // Each requirement that does not hold fails with what there is.
    async fn failure(f: impl std::future::Future<Output = ()>) -> String {
        let panicked = AssertUnwindSafe(f).catch_unwind().await.expect_err("the requirement fails");
        panicked.downcast_ref::<String>().cloned().unwrap_or_default()
    }
    let said = failure(async { drop(inbox.require_status("stripe", "evt_2", Status::Done).await) }).await;
    assert!(
        said.contains("is failed after 1 attempt(s), expected done; failure reason: ")
            && said.contains("voided invoices are not ours"),
        "{said}"
    );
    let said = failure(async { drop(inbox.require_status("stripe", "evt_9", Status::Done).await) }).await;
    assert_eq!(said, "stripe evt_9 is not stored: expected it done");
    let said = failure(async { drop(inbox.require_enqueued("stripe", "evt_1", "default").await) }).await;
    assert_eq!(
        said,
        r#"stripe evt_1 enqueued nothing for "default"; it enqueued 1 message(s): "receipt:in_1" for "billing" (invoice in_1)"#
    );
    let said = failure(inbox.require_nothing_enqueued("stripe", "evt_1")).await;
    assert!(said.ends_with("expected nothing"), "{said}");
}
