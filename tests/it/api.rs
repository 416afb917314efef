//! The management API (`/api/v1`) in-process, over real PostgreSQL: tokens
//! (hashed, roles, revocation, last use), the events listing and one event,
//! replay and erase, requeue and erase jobs with their progress and cancel,
//! the rate limit, and every error as JSON. schemathesis drives a running one
//! in `inbox/tests/api.rs`.

use std::time::Duration;

use axum::{body::Body, Router};
use http::{header, Request, StatusCode};
use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use sqlx::PgPool;
use tower::ServiceExt as _;
use webhook_inbox::config::{Catalog, Env, Secrets};
use webhook_inbox_console::{self as console, UserRole};

use crate::console::settings;

pub(crate) struct Api {
    router: Router,
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Value,
}

impl Api {
    pub(crate) fn new(pool: &PgPool, base: &str, env: &[(&str, &str)]) -> Api {
        let env = Env::from_pairs(env);
        let router = console::router(
            pool.clone(),
            pool.clone(),
            Catalog::builtin(),
            Secrets::development(),
            base,
            settings(&env),
        );
        Api { router }
    }

    pub(crate) async fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
        let authorization = token.map(|t| format!("Bearer {t}"));
        self.call_as(None, method, path, authorization.as_deref(), body).await
    }

    /// A call from `client` (an address, as the listener gives it), with this `Authorization` header.
    pub(crate) async fn call_as(
        &self,
        client: Option<&str>,
        method: &str,
        path: &str,
        authorization: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut req = Request::builder().method(method).uri(path).header(header::HOST, "inbox.test");
        if let Some(a) = authorization {
            req = req.header(header::AUTHORIZATION, a);
        }
        if let Some(c) = client {
            let addr: std::net::SocketAddr = format!("{c}:40000").parse().unwrap();
            req = req.extension(axum::extract::ConnectInfo(addr));
        }
        let req = match body {
            Some(b) => req.header(header::CONTENT_TYPE, "application/json").body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .unwrap();
        let res = self.router.clone().oneshot(req).await.unwrap();
        let (status, headers) = (res.status(), res.headers().clone());
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("{method} {path}: {status} not JSON: {}", String::from_utf8_lossy(&bytes)));
        assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{method} {path}");
        Answer { status, headers, body }
    }
}

async fn row(pool: &PgPool, provider: &str, id: &str, event_type: &str, status: &str, payload: Value) {
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, secret_index, processed_at,
                                    failure_reason)
         VALUES ($1, $2, $3, $4, $5, convert_to($4::text, 'UTF8'), 0, CASE WHEN $5 <> 'pending' THEN now() END,
                 CASE WHEN $5 = 'failed' THEN 'boom' END)",
    )
    .bind(provider)
    .bind(id)
    .bind(event_type)
    .bind(payload)
    .bind(status)
    .execute(pool)
    .await
    .unwrap();
}

pub(crate) async fn tokens(pool: &PgPool) -> (String, String) {
    let operator = console::add_token(pool, "runbook", UserRole::Operator, "the test").await.unwrap();
    let viewer = console::add_token(pool, "dashboard", UserRole::Viewer, "the test").await.unwrap();
    (operator, viewer)
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn tokens_authenticate_with_their_roles_are_kept_hashed_and_revocable(pool: PgPool) {
    let api = Api::new(&pool, "", &[]);
    let (operator, viewer) = tokens(&pool).await;
    assert!(operator.starts_with("inbox_") && operator.len() > 40);
    assert!(matches!(
        console::add_token(&pool, "runbook", UserRole::Viewer, "x").await,
        Err(console::UserError::Exists)
    ));
    // Nothing in the database holds a token.
    let stored: String = sqlx::query_scalar("SELECT string_agg(t::text, ' ') FROM inbox_api_tokens AS t")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!stored.contains(&operator[6..]) && !stored.contains(&viewer[6..]));

    let none = api.call("GET", "/api/v1/events", None, None).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.headers[header::WWW_AUTHENTICATE], "Bearer");
    assert!(none.body["error"].as_str().unwrap().contains("Authorization: Bearer"));
    for bad in ["nope", "inbox_not-a-token", &format!("{operator}x")] {
        assert_eq!(api.call("GET", "/api/v1/events", Some(bad), None).await.status, StatusCode::UNAUTHORIZED, "{bad}");
    }
    assert_eq!(api.call("GET", "/api/v1/events", Some(&viewer), None).await.status, StatusCode::OK);
    row(&pool, "stripe", "evt_1", "charge.succeeded", "done", json!({})).await;
    let refused =
        api.call("POST", "/api/v1/events/stripe/evt_1/replay", Some(&viewer), Some(json!({"reason": "x"}))).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let used: Option<String> =
        sqlx::query_scalar("SELECT last_used_at::text FROM inbox_api_tokens WHERE name = 'dashboard'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(used.is_some(), "its last use is recorded");

    assert!(console::revoke_token(&pool, "dashboard", "the test").await.unwrap());
    assert!(!console::revoke_token(&pool, "dashboard", "the test").await.unwrap());
    assert_eq!(api.call("GET", "/api/v1/events", Some(&viewer), None).await.status, StatusCode::UNAUTHORIZED);
    let audited: Vec<String> =
        sqlx::query_scalar("SELECT action FROM inbox_audit WHERE api_token = 'dashboard' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(audited, ["token_add", "token_revoke"]);
    // The document is public, and says how to authenticate.
    let doc = api.call("GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(doc.status, StatusCode::OK);
    assert_eq!(doc.body["openapi"], "3.1.0");
    assert_eq!(doc.body["components"]["securitySchemes"]["token"]["scheme"], "bearer");
    // Every time is an RFC 3339 date-time, and the document says so.
    let schemas = &doc.body["components"]["schemas"];
    for (schema, field) in [("EventItem", "received_at"), ("JobView", "created_at"), ("Pause", "paused_at")] {
        let property = &schemas[schema]["properties"][field];
        let format = property["format"].as_str().or(property["oneOf"][0]["format"].as_str());
        assert_eq!(format, Some("date-time"), "{schema}.{field}: {property}");
    }
    for path in ["/api/v1/nothing-here", "/api/v1", "/api/v1/"] {
        assert_eq!(api.call("GET", path, Some(&operator), None).await.status, StatusCode::NOT_FOUND, "{path}");
    }
    let wrong = api.call("PUT", "/api/v1/events", Some(&operator), None).await;
    assert_eq!(wrong.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(wrong.body["error"].is_string() && wrong.headers.contains_key(header::ALLOW), "{:?}", wrong.headers);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn events_are_listed_shown_replayed_and_erased(pool: PgPool) {
    let api = Api::new(&pool, "/console", &[]);
    let (operator, _) = tokens(&pool).await;
    for i in 0..5 {
        row(&pool, "stripe", &format!("evt_{i}"), "charge.succeeded", "done", json!({"email": "ann@example.com"}))
            .await;
    }
    row(&pool, "github", "delivery/with/slashes", "push", "failed", json!({"ref": "main"})).await;
    let op = Some(operator.as_str());
    // Under a base, a route or a method the API lacks is answered with where its document is served.
    for (method, path) in [("PUT", "/console/api/v1/events"), ("GET", "/console/api/v1/nothing-here")] {
        let lacking = api.call(method, path, op, None).await;
        let said = lacking.body["error"].as_str().unwrap_or_default();
        assert!(said.ends_with("(the document: /console/api/v1/openapi.json)"), "{method} {path}: {said}");
    }

    let page = api.call("GET", "/console/api/v1/events?provider=stripe&status=done&limit=2", op, None).await;
    assert_eq!(page.status, StatusCode::OK, "{:?}", page.body);
    let received = page.body["events"][0]["received_at"].as_str().unwrap_or_default();
    assert!(rfc3339(received), "an RFC 3339 time in UTC: {received:?}");
    assert_eq!(page.body["events"].as_array().unwrap().len(), 2);
    let next = page.body["next"].as_str().unwrap().to_string();
    let rest =
        api.call("GET", &format!("/console/api/v1/events?provider=stripe&limit=10&after={next}"), op, None).await;
    assert_eq!(rest.body["events"].as_array().unwrap().len(), 3);
    assert!(rest.body["next"].is_null());
    for (query, why) in [
        ("limit=0", "limit is 1 to 500"),
        ("status=bogus", "is not one of"),
        ("since=yesterday", "since"),
        ("since=2026-13-45T99:00:00Z", "PostgreSQL cannot read"),
        ("after=garbage", "cursor"),
        ("id=a&id_prefix=b", "not both"),
        ("surprise=1", "unknown field"),
    ] {
        let bad = api.call("GET", &format!("/console/api/v1/events?{query}"), op, None).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{query}: {:?}", bad.body);
        assert!(bad.body["error"].as_str().unwrap().contains(why), "{query}: {:?}", bad.body);
    }

    let shown = api.call("GET", "/console/api/v1/events/github/delivery%2Fwith%2Fslashes", op, None).await;
    assert_eq!(shown.status, StatusCode::OK, "{:?}", shown.body);
    assert_eq!((shown.body["status"].as_str(), shown.body["failure_reason"].as_str()), (Some("failed"), Some("boom")));
    assert_eq!(shown.body["payload"], json!({"ref": "main"}));
    let missing = api.call("GET", "/console/api/v1/events/github/nope", op, None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let nul = api.call("GET", "/console/api/v1/events/github/a%00b", op, None).await;
    assert!(nul.status.is_client_error(), "{:?}", nul.body);

    let replay = |id: &'static str, reason: Value| {
        let path = format!("/console/api/v1/events/github/{id}/replay");
        let api = &api;
        async move { api.call("POST", &path, op, Some(reason)).await }
    };
    let done = replay("delivery%2Fwith%2Fslashes", json!({"reason": "bug 42 fixed"})).await;
    assert_eq!(done.status, StatusCode::OK, "{:?}", done.body);
    assert_eq!(done.body["from_status"], "failed");
    assert_eq!(replay("delivery%2Fwith%2Fslashes", json!({"reason": "again"})).await.status, StatusCode::CONFLICT);
    assert_eq!(replay("delivery%2Fwith%2Fslashes", json!({"reason": ""})).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        replay("delivery%2Fwith%2Fslashes", json!({"reason": "x", "more": 1})).await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(replay("nope", json!({"reason": "x"})).await.status, StatusCode::NOT_FOUND);
    let history = api.call("GET", "/console/api/v1/events/github/delivery%2Fwith%2Fslashes", op, None).await;
    assert_eq!(history.body["history"][0]["actor"], "api:runbook");
    assert_eq!(history.body["history"][0]["reason"], "bug 42 fixed");

    let erase =
        api.call("POST", "/console/api/v1/events/stripe/evt_0/erase", op, Some(json!({"reason": "GDPR #1"}))).await;
    assert_eq!(erase.status, StatusCode::OK, "{:?}", erase.body);
    let again =
        api.call("POST", "/console/api/v1/events/stripe/evt_0/erase", op, Some(json!({"reason": "GDPR #1"}))).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    let erased = api.call("GET", "/console/api/v1/events/stripe/evt_0", op, None).await;
    assert!(erased.body["payload"].is_null() && erased.body["erased_by"] == "api:runbook", "{:?}", erased.body);
    let not_json = api.router.clone().oneshot(
        Request::post("/console/api/v1/events/stripe/evt_1/erase")
            .header(header::AUTHORIZATION, format!("Bearer {operator}"))
            .body(Body::from("reason=x"))
            .unwrap(),
    );
    assert_eq!(not_json.await.unwrap().status(), StatusCode::BAD_REQUEST);
}

async fn wait_for(api: &Api, token: &str, id: i64) -> Value {
    for _ in 0..200 {
        let job = api.call("GET", &format!("/api/v1/jobs/{id}"), Some(token), None).await.body;
        if job["state"] != "running" {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {id} did not end");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn bulk_operations_run_as_jobs_with_an_estimate_progress_and_cancel(pool: PgPool) {
    let api = Api::new(&pool, "", &[]);
    let (operator, viewer) = tokens(&pool).await;
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, secret_index, processed_at)
         SELECT 'stripe', 'evt_' || i, CASE WHEN i <= 1500 THEN 'invoice.paid' ELSE 'charge.succeeded' END,
                jsonb_build_object('n', i, 'email', CASE WHEN i % 100 = 0 THEN 'ann@example.com' END),
                'unhandled', '{}', 0, now() - interval '1 minute'
         FROM generate_series(1, 30000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let op = Some(operator.as_str());
    let requeue =
        json!({"statuses": ["unhandled"], "provider": "stripe", "type": "invoice.paid", "reason": "handler deployed"});
    assert_eq!(
        api.call("POST", "/api/v1/requeue", Some(&viewer), Some(requeue.clone())).await.status,
        StatusCode::FORBIDDEN
    );
    let started = api.call("POST", "/api/v1/requeue", op, Some(requeue)).await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{:?}", started.body);
    // Answered at once: the job counts what it selects itself.
    assert_eq!((started.body["estimate"].as_i64(), started.body["kind"].as_str()), (None, Some("requeue")));
    let job = wait_for(&api, &operator, started.body["id"].as_i64().unwrap()).await;
    assert_eq!((job["state"].as_str(), job["processed"].as_i64()), (Some("succeeded"), Some(1500)), "{job}");
    assert_eq!(job["estimate"], 1500, "{job}");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'pending'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pending, 1500);
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_audit WHERE actor = 'api:runbook' AND action = 'requeue'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(audited, 1500);

    // A big one, cancelled at once: it stops after a batch, and what it did is what it says.
    let big = json!({"statuses": ["unhandled"], "reason": "everything"});
    let started = api.call("POST", "/api/v1/requeue", op, Some(big)).await;
    let id = started.body["id"].as_i64().unwrap();
    let cancel = api.call("DELETE", &format!("/api/v1/jobs/{id}"), op, None).await;
    assert_eq!(cancel.status, StatusCode::ACCEPTED, "{:?}", cancel.body);
    let job = wait_for(&api, &operator, id).await;
    assert_eq!(job["state"], "cancelled", "{job}");
    let processed = job["processed"].as_i64().unwrap();
    assert!(processed < 28_500, "{job}");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'pending'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pending, 1500 + processed, "the job's count is what it did");
    assert_eq!(job["cancelled_by"], "runbook", "{job}");
    assert_eq!(api.call("DELETE", &format!("/api/v1/jobs/{id}"), op, None).await.status, StatusCode::CONFLICT);
    assert_eq!(api.call("GET", "/api/v1/jobs/999999", op, None).await.status, StatusCode::NOT_FOUND);
    assert_eq!(api.call("GET", "/api/v1/jobs/abc", op, None).await.status, StatusCode::NOT_FOUND);
    let listed = api.call("GET", "/api/v1/jobs", Some(&viewer), None).await;
    assert_eq!(listed.body["jobs"].as_array().unwrap().len(), 2);
    let audited: Vec<(String, Option<i64>)> = sqlx::query_as(
        "SELECT action, job_id FROM inbox_audit WHERE job_id IS NOT NULL AND api_token = 'runbook' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        audited,
        [("start_requeue".into(), Some(1)), ("start_requeue".into(), Some(2)), ("cancel_job".into(), Some(2))]
    );

    // Erase by selection: one customer's events, as a job.
    let nothing = api.call("POST", "/api/v1/erase", op, Some(json!({"reason": "x"}))).await;
    assert_eq!(nothing.status, StatusCode::BAD_REQUEST);
    let everything = api.call("POST", "/api/v1/erase", op, Some(json!({"since": "30d", "reason": "x"}))).await;
    assert_eq!(everything.status, StatusCode::BAD_REQUEST, "no bound, no dry run: {}", everything.body);
    assert!(everything.body["error"].as_str().unwrap().contains("at_most"), "{}", everything.body);
    let named = json!({"payload": "ann@example.com", "since": "1d", "at_most": 300, "reason": "ann@example.com asked"});
    let named = api.call("POST", "/api/v1/erase", op, Some(named)).await;
    assert_eq!(named.status, StatusCode::BAD_REQUEST, "the reason would keep the e-mail: {}", named.body);
    // A dry run counts, in the job.
    let dry = json!({"payload": "ann@example.com", "since": "1d", "dry_run": true, "reason": "GDPR #7"});
    let started = api.call("POST", "/api/v1/erase", op, Some(dry)).await;
    let job = wait_for(&api, &operator, started.body["id"].as_i64().unwrap()).await;
    assert_eq!((job["state"].as_str(), job["result"]["matching"].as_i64()), (Some("succeeded"), Some(300)), "{job}");
    let erasable = job["estimate"].as_i64().unwrap();
    // Bounded below what it holds: the job fails and says why, nothing erased.
    let bounded = json!({"payload": "ann@example.com", "since": "1d", "at_most": erasable - 1, "reason": "GDPR #7"});
    let started = api.call("POST", "/api/v1/erase", op, Some(bounded)).await;
    let job = wait_for(&api, &operator, started.body["id"].as_i64().unwrap()).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert!(job["error"].as_str().unwrap().contains("more than at most"), "{job}");
    let erased: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE erased_at IS NOT NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(erased, 0);
    let erase = json!({"payload": "ann@example.com", "since": "1d", "at_most": erasable, "reason": "GDPR #7"});
    let started = api.call("POST", "/api/v1/erase", op, Some(erase)).await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{:?}", started.body);
    let job = wait_for(&api, &operator, started.body["id"].as_i64().unwrap()).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["estimate"], erasable, "{job}");
    // The pending ones (requeued above) are left, as the CLI leaves them.
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM webhook_inbox WHERE payload::text LIKE '%ann@example.com%' AND status <> 'pending'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 0, "{job}");
    let pending = job["result"]["pending"].as_i64().unwrap();
    assert!(pending > 0 && job["result"]["erased"].as_i64().unwrap() + pending == 300, "{job}");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_outbox_destinations_pauses_and_alerts_are_read_and_acted_on(pool: PgPool) {
    let api = Api::new(&pool, "", &[]);
    let (operator, viewer) = tokens(&pool).await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, attempts, dead_at, last_error)
         VALUES ('receipt', 'r1', '{}', 'receipt:r1', 10, now(), 'HTTP 500') RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let dead = api.call("GET", "/api/v1/outbox?dead=true", Some(&viewer), None).await;
    assert_eq!(dead.status, StatusCode::OK, "{:?}", dead.body);
    assert_eq!(dead.body["messages"][0]["last_error"], "HTTP 500");
    assert_eq!(api.call("GET", "/api/v1/outbox", Some(&viewer), None).await.body["messages"], json!([]));
    assert_eq!(api.call("GET", "/api/v1/outbox?dead=maybe", Some(&viewer), None).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(api.call("GET", "/api/v1/outbox?limit=", Some(&viewer), None).await.status, StatusCode::BAD_REQUEST);
    let retry = |token: &str, id: String| {
        let (api, token) = (&api, token.to_string());
        async move {
            api.call(
                "POST",
                &format!("/api/v1/outbox/{id}/retry"),
                Some(&token),
                Some(json!({"reason": "consumer fixed"})),
            )
            .await
        }
    };
    assert_eq!(retry(&viewer, id.to_string()).await.status, StatusCode::FORBIDDEN);
    let retried = retry(&operator, id.to_string()).await;
    assert_eq!((retried.status, retried.body["retried"].as_bool()), (StatusCode::OK, Some(true)), "{:?}", retried.body);
    assert_eq!(api.call("GET", "/api/v1/outbox", Some(&viewer), None).await.body["messages"][0]["attempts"], 0);
    assert_eq!(retry(&operator, "999999".into()).await.status, StatusCode::NOT_FOUND);
    assert_eq!(retry(&operator, "abc".into()).await.status, StatusCode::NOT_FOUND);
    let by: String = sqlx::query_scalar("SELECT actor FROM inbox_audit WHERE message_id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(by, "api:runbook");

    let destinations = api.call("GET", "/api/v1/destinations", Some(&viewer), None).await;
    assert_eq!(destinations.body["destinations"][0]["name"], "default", "{:?}", destinations.body);
    assert_eq!(destinations.body["destinations"][0]["backlog"], 1);
    let by = webhook_inbox::ops::Audit { actor: "ops", action: "pause", reason: "orders handler broken" };
    let scope = webhook_inbox::ops::PauseScope { provider: "shopify".into(), event_type: None };
    webhook_inbox::ops::pause_events(&pool, &scope, Duration::from_secs(3600), &by).await.unwrap();
    let pauses = api.call("GET", "/api/v1/pauses", Some(&viewer), None).await;
    assert_eq!(
        (pauses.body["pauses"][0]["provider"].as_str(), pauses.body["pauses"][0]["reason"].as_str()),
        (Some("shopify"), Some("orders handler broken"))
    );
    let alerts = api.call("GET", "/api/v1/alerts?resolved=true", Some(&viewer), None).await;
    assert_eq!((alerts.status, &alerts.body["alerts"]), (StatusCode::OK, &json!([])));

    // Acting on them: pause and resume a provider, pause and resume a destination, an alert that is not there.
    let post = |path: &'static str, token: &str, body: Value| {
        let (api, token) = (&api, token.to_string());
        async move { api.call("POST", path, Some(&token), Some(body)).await }
    };
    let github =
        json!({"provider": "github", "type": "issues", "reason": "issues handler broken", "alarm_after": "30m"});
    assert_eq!(post("/api/v1/pauses", &viewer, github.clone()).await.status, StatusCode::FORBIDDEN);
    let paused = post("/api/v1/pauses", &operator, github.clone()).await;
    assert_eq!((paused.status, paused.body["outcome"].as_str()), (StatusCode::OK, Some("paused")), "{:?}", paused.body);
    assert_eq!(post("/api/v1/pauses", &operator, github).await.body["outcome"], "paused_already");
    for bad in [
        json!({"provider": "Not A Provider!", "reason": "x"}),
        json!({"provider": "github", "reason": "x", "alarm_after": "soon"}),
        json!({"provider": "github", "type": "", "reason": "x"}),
    ] {
        assert_eq!(post("/api/v1/pauses", &operator, bad.clone()).await.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let resumed =
        post("/api/v1/pauses/resume", &operator, json!({"provider": "github", "type": "issues", "reason": "fixed"}))
            .await;
    assert_eq!(
        (resumed.status, resumed.body["outcome"].as_str()),
        (StatusCode::ACCEPTED, Some("resuming")),
        "{:?}",
        resumed.body
    );
    let never = post("/api/v1/pauses/resume", &operator, json!({"provider": "stripe", "reason": "x"})).await;
    assert_eq!(never.status, StatusCode::NOT_FOUND);
    let actions: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM inbox_audit WHERE actor = 'api:runbook' AND pause_id IS NOT NULL ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(actions, ["pause", "resume"]);

    let stop = post("/api/v1/destinations/default/pause", &operator, json!({"reason": "consumer down"})).await;
    assert_eq!((stop.status, stop.body["changed"].as_bool()), (StatusCode::OK, Some(true)), "{:?}", stop.body);
    assert_eq!(
        post("/api/v1/destinations/default/pause", &operator, json!({"reason": "x"})).await.body["changed"],
        false
    );
    let listed = api.call("GET", "/api/v1/destinations", Some(&viewer), None).await;
    assert!(listed.body["destinations"][0]["paused_at"].is_string(), "{:?}", listed.body);
    assert_eq!(
        post("/api/v1/destinations/default/resume", &operator, json!({"reason": "back"})).await.body["changed"],
        true
    );
    assert_eq!(
        post("/api/v1/destinations/Bad%20Name/pause", &operator, json!({"reason": "x"})).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        post("/api/v1/destinations/default/explode", &operator, json!({"reason": "x"})).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        post("/api/v1/alerts/999/acknowledge", &operator, json!({"reason": "x"})).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(post("/api/v1/alerts/1/explode", &operator, json!({"reason": "x"})).await.status, StatusCode::NOT_FOUND);
}

/// A job whose one event waits (a lock another session holds) past the 30 s a
/// stopped process is known by: its heartbeat keeps it running, a cancel is
/// taken and reaches it within that event; jobs at once are capped.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_job_stuck_on_one_event_stays_running_is_cancelled_within_it_and_jobs_at_once_are_capped(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    use sqlx::Connection as _;
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let api = Api::new(&pool, "", &[]);
    let (operator, _) = tokens(&pool).await;
    let op = Some(operator.as_str());
    for i in 1..=3 {
        row(&pool, "stripe", &format!("evt_{i}"), "charge.succeeded", "done", json!({})).await;
    }
    let mut locker = sqlx::PgConnection::connect_with(&opts).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("SELECT 1 FROM webhook_inbox WHERE event_id = 'evt_1' FOR UPDATE").execute(&mut locker).await.unwrap();
    let erase = json!({"provider": "stripe", "at_most": 3, "reason": "GDPR #8"});
    let mut ids = Vec::new();
    for _ in 0..4 {
        let started = api.call("POST", "/api/v1/erase", op, Some(erase.clone())).await;
        assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.body);
        ids.push(started.body["id"].as_i64().unwrap());
    }
    let fifth = api.call("POST", "/api/v1/erase", op, Some(erase.clone())).await;
    assert_eq!(fifth.status, StatusCode::CONFLICT, "{}", fifth.body);
    assert!(fifth.body["error"].as_str().unwrap().contains("4 jobs are running"), "{}", fifth.body);

    tokio::time::sleep(Duration::from_secs(33)).await;
    for id in &ids {
        let job = api.call("GET", &format!("/api/v1/jobs/{id}"), op, None).await.body;
        assert_eq!(job["state"], "running", "its heartbeat says so while its event waits: {job}");
    }
    let cancel = api.call("DELETE", &format!("/api/v1/jobs/{}", ids[0]), op, None).await;
    assert_eq!(cancel.status, StatusCode::ACCEPTED, "{}", cancel.body);
    // The heartbeat brings the cancel to the runner while it waits; released, it stops after that event.
    tokio::time::sleep(Duration::from_secs(6)).await;
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    let cancelled = wait_for(&api, &operator, ids[0]).await;
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    assert!(cancelled["processed"].as_i64().unwrap() <= 1, "stopped within its first event: {cancelled}");
    assert_eq!(cancelled["cancelled_by"], "runbook");
    for id in &ids[1..] {
        assert_ne!(wait_for(&api, &operator, *id).await["state"], "running");
    }
    let cancels: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_audit WHERE action = 'cancel_job' AND actor = 'api:runbook'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(cancels, 1);
}

/// `2026-12-07T19:03:31.123456+00:00`: RFC 3339, in UTC, as every time the API answers.
fn rfc3339(t: &str) -> bool {
    let b = t.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let fraction = t.get(19..t.len().saturating_sub(6)).unwrap_or("x");
    b.len() >= 25
        && digits(0..4)
        && (b[4], b[7], b[10], b[13], b[16]) == (b'-', b'-', b'T', b':', b':')
        && digits(5..7)
        && digits(8..10)
        && digits(11..13)
        && digits(14..16)
        && digits(17..19)
        && t.ends_with("+00:00")
        && (fraction.is_empty()
            || fraction.strip_prefix('.').is_some_and(|f| !f.is_empty() && f.bytes().all(|d| d.is_ascii_digit())))
}
