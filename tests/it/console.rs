//! The console's pages in-process (its router, over real PostgreSQL): sign-in
//! and its limit, sessions, where sign-in leads back to, bad parameters,
//! requeue by filter with its progress, outbox retries, and reads through a
//! read-only role. The browser's view is `inbox/tests/console.rs`.

use axum::{body::Body, Router};
use http::{header, Request, StatusCode};
use http_body_util::BodyExt as _;
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use tower::ServiceExt as _;
use webhook_inbox::{
    config::{Catalog, Env, Secrets},
    console::{self, UserRole},
    Provider,
};

/// The console at the root, on `pool` (reads on `read`), with its users.
struct Console {
    router: Router,
}

struct Answer {
    status: StatusCode,
    location: String,
    cookie: Option<String>,
    csp: String,
    body: String,
    set_cookies: Vec<String>,
}

impl Console {
    async fn new(pool: &PgPool, read: &PgPool) -> Console {
        Console::with(pool, read, false).await
    }

    /// `forwarded`: behind a load balancer, the client's address in `X-Forwarded-For`.
    async fn with(pool: &PgPool, read: &PgPool, forwarded: bool) -> Console {
        let env = if forwarded { vec![("INBOX_CONSOLE_CLIENT_IP", "x-forwarded-for")] } else { vec![] };
        Console::at(pool, read, "", &env).await
    }

    /// At `base`, set as `env` says.
    async fn at(pool: &PgPool, read: &PgPool, base: &str, env: &[(&str, &str)]) -> Console {
        for (name, role) in [("olga", UserRole::Operator), ("vic", UserRole::Viewer)] {
            match console::add_user(pool, name, role, "a long enough password", "the test").await {
                Ok(()) | Err(console::UserError::Exists) => {}
                Err(e) => panic!("{e}"),
            }
        }
        let (catalog, secrets) = (Catalog::builtin(), Secrets::development());
        let env = Env::from_pairs(env);
        let router = console::router(pool.clone(), read.clone(), catalog, secrets, base, &env).unwrap();
        Console { router }
    }

    async fn send(&self, method: &str, path: &str, cookie: Option<&str>, form: Option<&str>) -> Answer {
        self.send_from(method, path, cookie, form, None).await
    }

    async fn send_from(
        &self,
        method: &str,
        path: &str,
        cookie: Option<&str>,
        form: Option<&str>,
        forwarded_for: Option<&str>,
    ) -> Answer {
        let mut req = Request::builder().method(method).uri(path).header(header::HOST, "console.test");
        if let Some(f) = forwarded_for {
            req = req.header("x-forwarded-for", f);
        }
        if let Some(c) = cookie {
            req = req.header(header::COOKIE, format!("inbox_console={c}"));
        }
        let req = match form {
            Some(f) => req
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(f.to_string()))
                .unwrap(),
            None => req.body(Body::empty()).unwrap(),
        };
        let r = self.router.clone().oneshot(req).await.unwrap();
        let text =
            |name| r.headers().get(name).and_then(|v: &http::HeaderValue| v.to_str().ok()).unwrap_or("").to_string();
        let (location, csp) = (text(header::LOCATION), text(header::CONTENT_SECURITY_POLICY));
        let set_cookies: Vec<String> =
            r.headers().get_all(header::SET_COOKIE).iter().map(|v| v.to_str().unwrap().to_string()).collect();
        let status = r.status();
        let body = String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        let session = set_cookies.iter().find(|c| c.starts_with("inbox_console=")).cloned().unwrap_or_default();
        let cookie = session.strip_prefix("inbox_console=").map(|c| c.split(';').next().unwrap().to_string());
        Answer { status, location, cookie: cookie.filter(|c| !c.is_empty()), csp, body, set_cookies }
            .with_set_cookie(session)
    }

    async fn sign_in(&self, name: &str, password: &str, next: &str) -> Answer {
        let form = form(&[("name", name), ("password", password), ("next", next)]);
        self.send("POST", "/signin", None, Some(&form)).await
    }

    /// A session of `name`'s, and its CSRF token.
    async fn session(&self, name: &str) -> (String, String) {
        let signed = self.sign_in(name, "a long enough password", "").await;
        assert_eq!(signed.status, StatusCode::SEE_OTHER, "{}", signed.body);
        let cookie = signed.cookie.expect("a session cookie");
        let page = self.send("GET", "/events", Some(&cookie), None).await;
        let csrf = page.body.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
        (cookie, csrf)
    }
}

impl Answer {
    fn with_set_cookie(self, set_cookie: String) -> Answer {
        if set_cookie.starts_with("inbox_console=") && !set_cookie.starts_with("inbox_console=;") {
            for attribute in ["HttpOnly", "Secure", "SameSite=Lax", "Path=/"] {
                assert!(set_cookie.contains(attribute), "the session cookie is {attribute}: {set_cookie}");
            }
        }
        self
    }
}

fn form(pairs: &[(&str, &str)]) -> String {
    let mut f = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        f.append_pair(k, v);
    }
    f.finish()
}

async fn scalar<T>(pool: &PgPool, sql: &str) -> T
where
    T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn failed(pool: &PgPool, n: usize) {
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, failure_reason, raw_body, secret_index,
                                    attempts, processed_at)
         SELECT 'stripe', 'evt_' || i, 'invoice.paid', '{}', 'failed', 'attempt 10: the ledger said no', '{}', 0, 10, now()
         FROM generate_series(1, $1) AS i",
    )
    .bind(n as i32)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn sign_in_stops_after_five_wrong_passwords_for_that_name_even_with_the_right_one(pool: PgPool) {
    let c = Console::new(&pool, &pool).await;
    let wrong = c.sign_in("olga", "not the password at all", "").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.body.contains("do not match"), "{}", wrong.body);
    assert!(wrong.cookie.is_none());
    let nobody = c.sign_in("nobody", "a long enough password", "").await;
    assert_eq!(nobody.status, StatusCode::UNAUTHORIZED, "an unknown name is answered as a wrong password");
    for _ in 0..4 {
        assert_eq!(c.sign_in("olga", "still wrong", "").await.status, StatusCode::UNAUTHORIZED);
    }
    let limited = c.sign_in("olga", "a long enough password", "").await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS, "the sixth try waits, right password or not");
    assert!(limited.body.contains("try again in 15 minutes"), "{}", limited.body);
    assert!(limited.cookie.is_none());
    assert_eq!(
        c.sign_in("vic", "a long enough password", "").await.status,
        StatusCode::SEE_OTHER,
        "other names are not"
    );
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn sessions_need_a_cookie_of_ours_end_at_sign_out_and_expire(pool: PgPool) {
    let c = Console::new(&pool, &pool).await;
    let anonymous = c.send("GET", "/events?status=failed", None, None).await;
    assert_eq!(anonymous.status, StatusCode::SEE_OTHER);
    assert_eq!(anonymous.location, "/signin?next=%2Fevents%3Fstatus%3Dfailed", "back to the page after signing in");
    let forged = c.send("GET", "/events", Some("made-up-token"), None).await;
    assert_eq!(forged.status, StatusCode::SEE_OTHER, "a token we never issued is no session");

    let (cookie, csrf) = c.session("olga").await;
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM inbox_console_sessions").await, 1);
    let stored: Vec<u8> = scalar(&pool, "SELECT token_sha256 FROM inbox_console_sessions").await;
    assert_ne!(stored, cookie.as_bytes(), "only the token's hash is stored");
    assert_eq!(c.send("GET", "/events", Some(&cookie), None).await.status, StatusCode::OK);

    let refused = c.send("POST", "/signout", Some(&cookie), Some("csrf=wrong")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "signing out takes the CSRF token too");
    let out = c.send("POST", "/signout", Some(&cookie), Some(&form(&[("csrf", &csrf)]))).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(c.send("GET", "/events", Some(&cookie), None).await.status, StatusCode::SEE_OTHER, "signed out");

    let (cookie, _) = c.session("olga").await;
    sqlx::query("UPDATE inbox_console_sessions SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(c.send("GET", "/events", Some(&cookie), None).await.status, StatusCode::SEE_OTHER, "expired");

    let (cookie, _) = c.session("vic").await;
    console::remove_user(&pool, "vic", "the test").await.unwrap();
    assert_eq!(
        c.send("GET", "/events", Some(&cookie), None).await.status,
        StatusCode::SEE_OTHER,
        "a removed user's session ends"
    );
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn sign_in_leads_back_inside_the_console_only(pool: PgPool) {
    let c = Console::new(&pool, &pool).await;
    for (next, to) in [
        ("/events?status=failed", "/events?status=failed"),
        ("/event?provider=stripe&id=evt_1", "/event?provider=stripe&id=evt_1"),
        ("//attacker.example/x", "/events"),
        ("/\\attacker.example", "/events"),
        // A browser drops tabs and newlines while parsing: `//attacker.example` to it.
        ("/\t/attacker.example", "/events"),
        ("/\n/attacker.example", "/events"),
        ("/.//attacker.example", "/events"),
        ("https://attacker.example/", "/events"),
        ("javascript:alert(1)", "/events"),
        ("", "/events"),
    ] {
        let signed = c.sign_in("olga", "a long enough password", next).await;
        assert_eq!((signed.status, signed.location.as_str()), (StatusCode::SEE_OTHER, to), "next = {next:?}");
    }
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn bad_parameters_get_a_clear_page_and_every_page_its_policy(pool: PgPool) {
    let c = Console::new(&pool, &pool).await;
    let (cookie, _) = c.session("vic").await;
    for (path, says) in [
        ("/events?since=yesterday", "is neither a duration"),
        ("/events?status=exploded", "is not a status"),
        ("/events?after=bm90IGEgY3Vyc29y", "the page cursor is not one this listing gave"),
        ("/events?until=99999999999999999999d", "the number is missing or too large"),
    ] {
        let page = c.send("GET", path, Some(&cookie), None).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{path}");
        assert!(page.body.contains(says), "{path}: {}", page.body);
    }
    // A stranger's id in a page that says it is not there: escaped.
    let hostile =
        format!("/event?provider=stripe&id={}", form(&[("x", "<script>alert(1)</script>")]).trim_start_matches("x="));
    let missing = c.send("GET", &hostile, Some(&cookie), None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.contains("&#60;script&#62;alert(1)&#60;/script&#62;"), "{}", missing.body);
    assert!(!missing.body.contains("<script>"));
    let long = c.send("GET", &format!("/events?id={}&id_match=prefix", "x".repeat(10_000)), Some(&cookie), None).await;
    assert_eq!(long.status, StatusCode::OK, "a 10,000-character prefix finds nothing, and says so");
    assert!(long.body.contains("No event matches"));
    // A form that is no form: our page, never the framework's words.
    let json = Request::post("/event/replay")
        .header(header::HOST, "console.test")
        .header(header::COOKIE, format!("inbox_console={cookie}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(r#"{"provider":"stripe"}"#))
        .unwrap();
    let r = c.router.clone().oneshot(json).await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let text = String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("The form did not arrive whole") && text.contains("<!doctype html>"), "{text}");
    let nowhere = c.send("GET", "/no/such/page", Some(&cookie), None).await;
    assert_eq!(nowhere.status, StatusCode::NOT_FOUND);
    for page in [
        missing,
        nowhere,
        c.send("GET", "/signin", None, None).await,
        c.send("GET", "/health", Some(&cookie), None).await,
    ] {
        assert!(page.csp.contains("default-src 'none'") && !page.csp.contains("script-src"), "{}", page.csp);
    }
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn requeue_by_filter_counts_first_then_goes_in_batches_each_audited(pool: PgPool) {
    failed(&pool, 1_234).await;
    let c = Console::new(&pool, &pool).await;
    let (viewer, viewer_csrf) = c.session("vic").await;
    assert_eq!(c.send("GET", "/requeue?status=failed", Some(&viewer), None).await.status, StatusCode::FORBIDDEN);
    let (cookie, csrf) = c.session("olga").await;
    let count =
        c.send("GET", "/requeue?status=failed&provider=stripe&reason_like=%25ledger%25", Some(&cookie), None).await;
    assert_eq!(count.status, StatusCode::OK);
    assert!(count.body.contains("1234 match"), "the count comes first: {}", count.body);
    assert!(count.body.contains("Requeue 1234"), "{}", count.body);

    let fields =
        [("status", "failed"), ("provider", "stripe"), ("reason_like", "%ledger%"), ("reason", "the ledger is fixed")];
    let mut without = fields.to_vec();
    let refused = c.send("POST", "/requeue", Some(&cookie), Some(&form(&without))).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "no CSRF token, no requeue");
    without.push(("csrf", &viewer_csrf));
    assert_eq!(c.send("POST", "/requeue", Some(&viewer), Some(&form(&without))).await.status, StatusCode::FORBIDDEN);
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'pending'").await, 0);

    let mut with = fields.to_vec();
    with.push(("csrf", &csrf));
    let run = c.send("POST", "/requeue", Some(&cookie), Some(&form(&with))).await;
    assert_eq!(run.status, StatusCode::OK);
    for line in
        ["batch 1: 500 of 1234 requeued", "batch 2: 1000 of 1234", "batch 3: 1234 of 1234", "Done: 1234 requeued."]
    {
        assert!(run.body.contains(line), "the progress says {line:?}: {}", run.body);
    }
    assert!(run.body.trim_end().ends_with("</html>"), "the page is whole");
    assert_eq!(
        scalar::<i64>(&pool, "SELECT count(*) FROM webhook_inbox WHERE status = 'pending' AND attempts = 0").await,
        1_234
    );
    let audited: i64 = scalar(
        &pool,
        "SELECT count(*) FROM inbox_audit WHERE actor = 'console:olga' AND action = 'requeue'
           AND reason = 'the ledger is fixed' AND from_status = 'failed'",
    )
    .await;
    assert_eq!(audited, 1_234);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn outbox_retries_from_the_console_are_audited_under_the_event(pool: PgPool) {
    inbox_tests::store(&pool, Provider::STRIPE, "evt_o", "invoice.paid", "{}").await;
    sqlx::query(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, message_key, payload, attempts, dead_at, last_error,
                                           event_provider, event_id)
         VALUES ('invoice', 'in_1', 'receipt:in_1', '{}', 10, now(), 'HTTP 400: no such customer', 'stripe', 'evt_o'),
                ('invoice', 'in_2', 'receipt:in_2', '{}', 10, now(), 'HTTP 400', NULL, NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let c = Console::new(&pool, &pool).await;
    let (cookie, csrf) = c.session("olga").await;
    let page = c.send("GET", "/event?provider=stripe&id=evt_o", Some(&cookie), None).await;
    assert!(page.body.contains("no such customer") && page.body.contains("Retry…"), "{}", page.body);
    // Stored without its signature header: the development secret cannot vouch for it.
    assert!(page.body.contains(r#"<dd class="bad">DOES NOT VERIFY"#), "{}", page.body);
    let id: i64 = scalar(&pool, "SELECT id FROM transactional_outbox WHERE message_key = 'receipt:in_1'").await;
    let retried = c
        .send(
            "POST",
            "/outbox/retry",
            Some(&cookie),
            Some(&form(&[("id", &id.to_string()), ("provider", "stripe"), ("event", "evt_o"), ("csrf", &csrf)])),
        )
        .await;
    assert_eq!(retried.status, StatusCode::SEE_OTHER);
    assert_eq!(retried.location, "/event?provider=stripe&id=evt_o&done=retried");
    let history = c.send("GET", "/event?provider=stripe&id=evt_o", Some(&cookie), None).await;
    assert!(history.body.contains(&format!("retry_outbox (message #{id})")), "{}", history.body);
    // Every dead one (the other, which no event wrote): counted in the confirmation first.
    let confirm = c.send("GET", "/outbox/retry", Some(&cookie), None).await;
    assert!(confirm.body.contains("1 dead outbox message(s)"), "{}", confirm.body);
    let all = c.send("POST", "/outbox/retry", Some(&cookie), Some(&form(&[("csrf", &csrf)]))).await;
    assert_eq!(all.location, "/outbox?retried=1");
    let audit: Vec<(Option<String>, i64, String, String)> = sqlx::query_as(
        "SELECT event_id, message_id, from_status, actor FROM inbox_audit WHERE console_user IS NULL ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let other: i64 = scalar(&pool, "SELECT id FROM transactional_outbox WHERE message_key = 'receipt:in_2'").await;
    assert_eq!(
        audit,
        [
            (Some("evt_o".into()), id, "dead".into(), "console:olga".into()),
            (None, other, "dead".into(), "console:olga".into())
        ]
    );
    assert_eq!(
        scalar::<i64>(&pool, "SELECT count(*) FROM transactional_outbox WHERE dead_at IS NULL AND attempts = 0").await,
        2
    );
}

/// The Outbox page shows each destination's state; an operator pauses and
/// resumes one (audited, CSRF-checked), a viewer cannot; a stranger's text
/// (a sink's answer) is escaped.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn destinations_are_shown_paused_and_resumed_from_the_console(pool: PgPool) {
    sqlx::query(
        "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, message_key, payload, destination)
         VALUES ('invoice', 'in_1', 'receipt:in_1', '{}', 'email'), ('invoice', 'in_2', 'bill:in_2', '{}', 'billing')",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO relay_destinations (name, target, seen_at, opened_at, failures, last_error)
         VALUES ('billing', 'http https://billing.example/', now(), now(), 7, 'HTTP 503: <script>alert(1)</script>')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let c = Console::new(&pool, &pool).await;
    let (cookie, csrf) = c.session("olga").await;
    let page = c.send("GET", "/outbox", Some(&cookie), None).await;
    assert!(page.body.contains("https://billing.example/") && page.body.contains("after 7 failures"), "{}", page.body);
    assert!(!page.body.contains("<script>alert"), "escaped: {}", page.body);
    assert!(
        page.body.contains("unconfigured") && page.body.contains("/outbox/pause?name=email&#38;pause=yes"),
        "{}",
        page.body
    );

    let (viewer, viewer_csrf) = c.session("vic").await;
    assert_eq!(c.send("GET", "/outbox/pause?name=email", Some(&viewer), None).await.status, StatusCode::FORBIDDEN);
    let as_viewer = form(&[("name", "email"), ("pause", "yes"), ("reason", "x"), ("csrf", &viewer_csrf)]);
    assert_eq!(c.send("POST", "/outbox/pause", Some(&viewer), Some(&as_viewer)).await.status, StatusCode::FORBIDDEN);
    let forged = form(&[("name", "email"), ("pause", "yes"), ("reason", "x"), ("csrf", "forged")]);
    assert_eq!(c.send("POST", "/outbox/pause", Some(&cookie), Some(&forged)).await.status, StatusCode::FORBIDDEN);
    let bad = form(&[("name", "Email<b>"), ("pause", "yes"), ("reason", "x"), ("csrf", &csrf)]);
    assert_eq!(c.send("POST", "/outbox/pause", Some(&cookie), Some(&bad)).await.status, StatusCode::BAD_REQUEST);

    let confirm = c.send("GET", "/outbox/pause?name=email&pause=yes", Some(&cookie), None).await;
    assert!(confirm.body.contains("Pause email?") && confirm.body.contains("none spending an attempt"));
    let pause = form(&[("name", "email"), ("pause", "yes"), ("reason", "mail provider incident"), ("csrf", &csrf)]);
    let paused = c.send("POST", "/outbox/pause", Some(&cookie), Some(&pause)).await;
    assert_eq!((paused.status, paused.location.as_str()), (StatusCode::SEE_OTHER, "/outbox?paused=email"));
    let page = c.send("GET", "/outbox?paused=email", Some(&cookie), None).await;
    assert!(page.body.contains("mail provider incident") && page.body.contains("Resume…"), "{}", page.body);
    let resume = form(&[("name", "email"), ("pause", "no"), ("reason", ""), ("csrf", &csrf)]);
    assert_eq!(c.send("POST", "/outbox/pause", Some(&cookie), Some(&resume)).await.location, "/outbox?resumed=email");
    let audit: Vec<(String, String, String)> =
        sqlx::query_as("SELECT actor, action, reason FROM inbox_audit WHERE destination = 'email' ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        audit,
        [
            ("console:olga".into(), "pause_destination".into(), "mail provider incident".into()),
            ("console:olga".into(), "resume_destination".into(), "resumed from the console".into())
        ]
    );
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn pages_read_through_the_read_only_role_and_actions_write_through_the_other(
    pool_options: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    failed(&pool, 3).await;
    let role = format!("reader_{}", std::process::id());
    for sql in [
        format!("DROP ROLE IF EXISTS {role}"),
        format!("CREATE ROLE {role} LOGIN"),
        format!("ALTER ROLE {role} SET default_transaction_read_only = on"),
        format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"),
    ] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    let read = PgPool::connect_with(opts.clone().username(&role)).await.unwrap();
    let c = Console::new(&pool, &read).await;
    let (cookie, csrf) = c.session("olga").await;
    let paths = [
        "/events",
        "/events?status=failed",
        "/event?provider=stripe&id=evt_1",
        "/health",
        "/outbox",
        "/pauses",
        "/alerts",
    ];
    for path in paths {
        let page = c.send("GET", path, Some(&cookie), None).await;
        assert_eq!(page.status, StatusCode::OK, "{path} reads through the read-only role: {}", page.body);
    }
    let replayed = c
        .send(
            "POST",
            "/event/replay",
            Some(&cookie),
            Some(&form(&[("provider", "stripe"), ("id", "evt_1"), ("csrf", &csrf)])),
        )
        .await;
    assert_eq!(replayed.status, StatusCode::SEE_OTHER, "actions write through DATABASE_URL's role");
    // The pages do use that role: without its grant, they cannot read.
    sqlx::query(&format!("REVOKE SELECT ON webhook_inbox FROM {role}")).execute(&pool).await.unwrap();
    let page = c.send("GET", "/events", Some(&cookie), None).await;
    assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(page.body.contains("nothing was changed") && !page.body.contains("permission denied"), "{}", page.body);
    read.close().await;
    sqlx::query(&format!("DROP OWNED BY {role}")).execute(&pool).await.unwrap();
    sqlx::query(&format!("DROP ROLE {role}")).execute(&pool).await.unwrap();
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn behind_a_load_balancer_each_client_address_is_limited_on_its_own(pool: PgPool) {
    let c = Console::with(&pool, &pool, true).await;
    let attempt = |name: String, from: &'static str| {
        let form = form(&[("name", &name), ("password", "a wrong guess"), ("next", "")]);
        let c = &c;
        async move { c.send_from("POST", "/signin", None, Some(&form), Some(from)).await.status }
    };
    // One client, 10.0.0.7 (the balancer appends it last; what comes before is the client's own, to forge), guessing names.
    for i in 0..20 {
        assert_eq!(attempt(format!("guess{i}"), "6.6.6.6, 10.0.0.7").await, StatusCode::UNAUTHORIZED);
    }
    let forged = attempt("guess20".into(), "1.2.3.4, 10.0.0.7").await;
    assert_eq!(forged, StatusCode::TOO_MANY_REQUESTS, "a forged first entry changes nothing");
    let other = form(&[("name", "olga"), ("password", "a long enough password"), ("next", "")]);
    let signed = c.send_from("POST", "/signin", None, Some(&other), Some("10.0.0.8")).await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER, "another client still signs in");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn concurrent_guesses_are_counted_before_any_password_is_checked_and_never_queued(pool: PgPool) {
    let c = Console::with(&pool, &pool, true).await;
    let guess = || {
        let form = form(&[("name", "olga"), ("password", "a wrong guess"), ("next", "")]);
        let c = &c;
        async move { c.send_from("POST", "/signin", None, Some(&form), Some("6.6.6.6")).await.status }
    };
    let mut checked = 0;
    for wave in 0..10 {
        let statuses = futures_util::future::join_all((0..30).map(|_| guess())).await;
        let wave_checked = statuses.iter().filter(|s| **s == StatusCode::UNAUTHORIZED).count();
        assert!(
            statuses.iter().all(|s| [
                StatusCode::UNAUTHORIZED,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE
            ]
            .contains(s)),
            "wave {wave}: {statuses:?}"
        );
        assert!(wave_checked <= 2, "wave {wave}: {wave_checked} passwords checked at once (the rest answered at once)");
        checked += wave_checked;
    }
    assert_eq!(checked, 5, "five password checks for one name from one client, however the guesses race");
    let right = form(&[("name", "olga"), ("password", "a long enough password"), ("next", "")]);
    let locked = c.send_from("POST", "/signin", None, Some(&right), Some("6.6.6.6")).await;
    assert_eq!(locked.status, StatusCode::TOO_MANY_REQUESTS);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_stranger_locks_out_only_themselves(pool: PgPool) {
    let c = Console::with(&pool, &pool, true).await;
    let from = |name: &str, password: &str, client: &str| {
        let form = form(&[("name", name), ("password", password), ("next", "")]);
        let (c, client) = (&c, client.to_string());
        async move { c.send_from("POST", "/signin", None, Some(&form), Some(&client)).await }
    };
    for _ in 0..5 {
        assert_eq!(from("olga", "a wrong guess", "6.6.6.6").await.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(from("olga", "a long enough password", "6.6.6.6").await.status, StatusCode::TOO_MANY_REQUESTS);
    let operator = from("olga", "a long enough password", "10.0.0.8").await;
    assert_eq!(operator.status, StatusCode::SEE_OTHER, "five requests from a stranger do not lock the operator out");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_lock_survives_a_flood_of_over_long_names_and_passwords_from_many_addresses(pool: PgPool) {
    let c = Console::with(&pool, &pool, true).await;
    let from = |name: &str, password: &str, client: &str| {
        let form = form(&[("name", name), ("password", password), ("next", "")]);
        let (c, client) = (&c, client.to_string());
        async move { c.send_from("POST", "/signin", None, Some(&form), Some(&client)).await }
    };
    for _ in 0..5 {
        assert_eq!(from("olga", "a wrong guess", "6.6.6.6").await.status, StatusCode::UNAUTHORIZED);
    }
    // Over-long passwords and names from 480 addresses (one IPv6 /64's worth): refused before anything counts them.
    let long_password = "p".repeat(2_000);
    for i in 0..10_000u32 {
        let client = format!("2001:db8::{:x}:{:x}", i % 480, i);
        let refused = if i % 2 == 0 {
            from(&format!("guess{i}"), &long_password, &client).await
        } else {
            from(&"n".repeat(65 + i as usize % 100), "a wrong guess", &client).await
        };
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{i}");
        assert!(refused.body.contains("no user has this one"), "{}", refused.body);
    }
    let still = from("olga", "a long enough password", "6.6.6.6").await;
    assert_eq!(still.status, StatusCode::TOO_MANY_REQUESTS, "the 15-minute lock holds");
    assert!(still.body.contains("try again in 15 minutes"), "{}", still.body);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_name_guessed_from_many_addresses_backs_off_except_in_the_operators_own_browser(pool: PgPool) {
    let c = Console::with(&pool, &pool, true).await;
    let right = form(&[("name", "olga"), ("password", "a long enough password"), ("next", "")]);
    let signed = c.send_from("POST", "/signin", None, Some(&right), Some("10.0.0.8")).await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER);
    let device =
        signed.set_cookies.iter().find_map(|c| c.strip_prefix("inbox_console_device=")).expect("a device cookie");
    let device = device.split(';').next().unwrap().to_string();
    for i in 0..10 {
        let guess = form(&[("name", "olga"), ("password", "a wrong guess"), ("next", "")]);
        let status = c.send_from("POST", "/signin", None, Some(&guess), Some(&format!("203.0.113.{i}"))).await.status;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    let elsewhere = c.send_from("POST", "/signin", None, Some(&right), Some("198.51.100.1")).await;
    assert_eq!(elsewhere.status, StatusCode::TOO_MANY_REQUESTS, "the name backs off from everywhere");
    assert!(elsewhere.body.contains("seconds"), "{}", elsewhere.body);
    let req = Request::post("/signin")
        .header(header::HOST, "console.test")
        .header("x-forwarded-for", "10.0.0.8")
        .header(header::COOKIE, format!("inbox_console_device={device}"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(right))
        .unwrap();
    let own = c.router.clone().oneshot(req).await.unwrap();
    assert_eq!(own.status(), StatusCode::SEE_OTHER, "the browser that signed in before is spared the back-off");
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_session_ends_after_its_idle_timeout_and_a_new_sign_in_ends_the_browsers_old_one(pool: PgPool) {
    let c = Console::at(&pool, &pool, "", &[("INBOX_CONSOLE_IDLE_TIMEOUT_MS", "600000")]).await;
    let (cookie, _) = c.session("olga").await;
    sqlx::query("UPDATE inbox_console_sessions SET last_seen_at = now() - interval '9 minutes'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(c.send("GET", "/events", Some(&cookie), None).await.status, StatusCode::OK, "used within 10 minutes");
    sqlx::query("UPDATE inbox_console_sessions SET last_seen_at = now() - interval '11 minutes'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(c.send("GET", "/events", Some(&cookie), None).await.status, StatusCode::SEE_OTHER, "idle too long");

    // Signing in again from a browser that holds a session (its own, or one planted in it) ends that one.
    let (old, _) = c.session("vic").await;
    let right = form(&[("name", "olga"), ("password", "a long enough password"), ("next", "")]);
    let again = c.send("POST", "/signin", Some(&old), Some(&right)).await;
    assert_eq!(again.status, StatusCode::SEE_OTHER);
    assert_eq!(c.send("GET", "/events", Some(&old), None).await.status, StatusCode::SEE_OTHER, "the old session ended");
    let new = again.cookie.unwrap();
    assert_eq!(c.send("GET", "/events", Some(&new), None).await.status, StatusCode::OK);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_user_sees_their_sessions_and_ends_the_others_and_everything_is_audited_under_their_name(pool: PgPool) {
    let c = Console::new(&pool, &pool).await;
    let failed = c.sign_in("olga", "not the password", "").await;
    assert_eq!(failed.status, StatusCode::UNAUTHORIZED);
    let (here, csrf) = c.session("olga").await;
    let (elsewhere, _) = c.session("olga").await;
    let (third, _) = c.session("olga").await;
    let (vics, _) = c.session("vic").await;
    let page = c.send("GET", "/sessions", Some(&here), None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.body.matches("<button type=\"submit\">End</button>").count(), 2, "{}", page.body);
    assert!(page.body.contains("this one") && page.body.contains("sign_in_failed"), "{}", page.body);
    let id: String =
        scalar(&pool, "SELECT encode(token_sha256, 'hex') FROM inbox_console_sessions WHERE user_name = 'vic'").await;
    // Another user's session cannot be ended from here.
    let other = c.send("POST", "/sessions/end", Some(&here), Some(&form(&[("csrf", &csrf), ("id", &id)]))).await;
    assert_eq!(other.location, "/sessions?ended=0");
    assert_eq!(c.send("GET", "/events", Some(&vics), None).await.status, StatusCode::OK);
    let no_csrf = c.send("POST", "/sessions/end", Some(&here), Some("id=")).await;
    assert_eq!(no_csrf.status, StatusCode::FORBIDDEN);
    let all = c.send("POST", "/sessions/end", Some(&here), Some(&form(&[("csrf", &csrf)]))).await;
    assert_eq!(all.location, "/sessions?ended=2");
    for gone in [&elsewhere, &third] {
        assert_eq!(c.send("GET", "/events", Some(gone), None).await.status, StatusCode::SEE_OTHER);
    }
    assert_eq!(c.send("GET", "/events", Some(&here), None).await.status, StatusCode::OK, "this one stays");
    c.send("POST", "/signout", Some(&here), Some(&form(&[("csrf", &csrf)]))).await;
    console::remove_user(&pool, "vic", "alice (INBOX_OPERATOR)").await.unwrap();

    let audit: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT actor, action, console_user FROM inbox_audit WHERE console_user IS NOT NULL ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let row = |actor: &str, action: &str, user: &str| (actor.to_string(), action.to_string(), user.to_string());
    assert_eq!(
        audit,
        [
            row("the test", "user_add", "olga"),
            row("the test", "user_add", "vic"),
            row("console:olga", "sign_in_failed", "olga"),
            row("console:olga", "sign_in", "olga"),
            row("console:olga", "sign_in", "olga"),
            row("console:olga", "sign_in", "olga"),
            row("console:vic", "sign_in", "vic"),
            row("console:olga", "session_end", "olga"),
            row("console:olga", "sign_out", "olga"),
            row("alice (INBOX_OPERATOR)", "user_remove", "vic"),
        ]
    );
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn over_https_the_cookies_are_the_hosts_alone_and_the_pages_ask_for_https_ever_after(pool: PgPool) {
    let signed_in = |c: &Console, headers: Vec<(&'static str, &'static str)>| {
        let mut req = Request::post("/signin")
            .header(header::HOST, "console.test")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let req = req.body(Body::from(form(&[("name", "olga"), ("password", "a long enough password")]))).unwrap();
        let router = c.router.clone();
        async move {
            let r = router.oneshot(req).await.unwrap();
            let cookies: Vec<String> =
                r.headers().get_all(header::SET_COOKIE).iter().map(|v| v.to_str().unwrap().to_string()).collect();
            let hsts = r.headers().get(header::STRICT_TRANSPORT_SECURITY).map(|v| v.to_str().unwrap().to_string());
            (r.status(), cookies, hsts)
        }
    };
    let https = Console::at(&pool, &pool, "", &[("INBOX_CONSOLE_HTTPS", "true")]).await;
    let (status, cookies, hsts) = signed_in(&https, vec![]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(
        cookies.iter().any(|c| c.starts_with("__Host-inbox_console=") && c.split("; ").any(|a| a == "Path=/")),
        "{cookies:?}"
    );
    assert!(cookies.iter().any(|c| c.starts_with("__Host-inbox_console_device=")), "{cookies:?}");
    assert!(!cookies.iter().any(|c| c.contains("Domain")), "{cookies:?}");
    assert_eq!(hsts.as_deref(), Some("max-age=31536000"));
    let session = cookies[..].iter().find_map(|c| c.strip_prefix("__Host-inbox_console=")).unwrap();
    let session = session.split(';').next().unwrap();
    let page = Request::get("/events")
        .header(header::HOST, "console.test")
        .header(header::COOKIE, format!("__Host-inbox_console={session}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(https.router.clone().oneshot(page).await.unwrap().status(), StatusCode::OK);
    let unprefixed = Request::get("/events")
        .header(header::HOST, "console.test")
        .header(header::COOKIE, format!("inbox_console={session}"))
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        https.router.clone().oneshot(unprefixed).await.unwrap().status(),
        StatusCode::SEE_OTHER,
        "over HTTPS only the prefixed cookie is read"
    );

    // Behind a balancer trusted for the client's address, its X-Forwarded-Proto says which.
    let balanced = Console::at(&pool, &pool, "", &[("INBOX_CONSOLE_CLIENT_IP", "x-forwarded-for")]).await;
    let (_, cookies, hsts) =
        signed_in(&balanced, vec![("x-forwarded-for", "10.0.0.8"), ("x-forwarded-proto", "https")]).await;
    assert!(cookies.iter().any(|c| c.starts_with("__Host-inbox_console=")) && hsts.is_some(), "{cookies:?}");
    let (_, cookies, hsts) =
        signed_in(&balanced, vec![("x-forwarded-for", "10.0.0.8"), ("x-forwarded-proto", "http")]).await;
    assert!(cookies.iter().any(|c| c.starts_with("inbox_console=")) && hsts.is_none(), "{cookies:?}");
    // Not trusted: a client's own X-Forwarded-Proto changes nothing.
    let plain = Console::at(&pool, &pool, "", &[]).await;
    let (_, cookies, hsts) = signed_in(&plain, vec![("x-forwarded-proto", "https")]).await;
    assert!(cookies.iter().any(|c| c.starts_with("inbox_console=")) && hsts.is_none(), "{cookies:?}");
    // Under a path (`/console` beside the webhooks), no prefix: a `__Host-` cookie must be at `/`.
    let nested = Console::at(&pool, &pool, "/console", &[("INBOX_CONSOLE_HTTPS", "true")]).await;
    let req = Request::post("/console/signin")
        .header(header::HOST, "console.test")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    let req = req.body(Body::from(form(&[("name", "olga"), ("password", "a long enough password")]))).unwrap();
    let r = nested.router.clone().oneshot(req).await.unwrap();
    let cookies: Vec<&str> = r.headers().get_all(header::SET_COOKIE).iter().map(|v| v.to_str().unwrap()).collect();
    assert!(cookies.iter().any(|c| c.starts_with("inbox_console=") && c.contains("Path=/console")), "{cookies:?}");
    assert!(r.headers().contains_key(header::STRICT_TRANSPORT_SECURITY));
}

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
