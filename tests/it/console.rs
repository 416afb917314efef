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
    Provider,
};
use webhook_inbox_console::{self as console, UserRole};

/// The console at the root, on `pool` (reads on `read`), with its users.
pub(crate) struct Console {
    pub(crate) router: Router,
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) location: String,
    pub(crate) cookie: Option<String>,
    pub(crate) csp: String,
    pub(crate) body: String,
    pub(crate) set_cookies: Vec<String>,
}

impl Console {
    pub(crate) async fn new(pool: &PgPool, read: &PgPool) -> Console {
        Console::with(pool, read, false).await
    }

    /// `forwarded`: behind a load balancer, the client's address in `X-Forwarded-For`.
    pub(crate) async fn with(pool: &PgPool, read: &PgPool, forwarded: bool) -> Console {
        let env = if forwarded { vec![("INBOX_CONSOLE_CLIENT_IP", "x-forwarded-for")] } else { vec![] };
        Console::at(pool, read, "", &env).await
    }

    /// At `base`, set as `env` says.
    pub(crate) async fn at(pool: &PgPool, read: &PgPool, base: &str, env: &[(&str, &str)]) -> Console {
        for (name, role) in [("olga", UserRole::Operator), ("vic", UserRole::Viewer)] {
            match console::add_user(pool, name, role, "a long enough password", "the test").await {
                Ok(()) | Err(console::UserError::Exists) => {}
                Err(e) => panic!("{e}"),
            }
        }
        let (catalog, secrets) = (Catalog::builtin(), Secrets::development());
        let env = Env::from_pairs(env);
        let router = console::router(pool.clone(), read.clone(), catalog, secrets, base, settings(&env));
        Console { router }
    }

    pub(crate) async fn send(&self, method: &str, path: &str, cookie: Option<&str>, form: Option<&str>) -> Answer {
        self.send_from(method, path, cookie, form, None).await
    }

    pub(crate) async fn send_from(
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

    pub(crate) async fn sign_in(&self, name: &str, password: &str, next: &str) -> Answer {
        let form = form(&[("name", name), ("password", password), ("next", next)]);
        self.send("POST", "/signin", None, Some(&form)).await
    }

    /// A session of `name`'s, and its CSRF token.
    pub(crate) async fn session(&self, name: &str) -> (String, String) {
        let signed = self.sign_in(name, "a long enough password", "").await;
        assert_eq!(signed.status, StatusCode::SEE_OTHER, "{}", signed.body);
        let cookie = signed.cookie.expect("a session cookie");
        let page = self.send("GET", "/events", Some(&cookie), None).await;
        let csrf = page.body.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
        (cookie, csrf)
    }
}

impl Answer {
    pub(crate) fn with_set_cookie(self, set_cookie: String) -> Answer {
        if set_cookie.starts_with("inbox_console=") && !set_cookie.starts_with("inbox_console=;") {
            for attribute in ["HttpOnly", "Secure", "SameSite=Lax", "Path=/"] {
                assert!(set_cookie.contains(attribute), "the session cookie is {attribute}: {set_cookie}");
            }
        }
        self
    }
}

pub(crate) fn form(pairs: &[(&str, &str)]) -> String {
    let mut f = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        f.append_pair(k, v);
    }
    f.finish()
}

pub(crate) async fn scalar<T>(pool: &PgPool, sql: &str) -> T
where
    T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

pub(crate) async fn failed(pool: &PgPool, n: usize) {
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
        let csp = &page.csp;
        assert!(csp.contains("default-src 'none'") && csp.contains("script-src 'self';"), "{csp}");
        assert!(!csp.contains("unsafe") && !csp.contains('*'), "no inline script, no eval, no other origin: {csp}");
    }
}

/// The Events page's live stream: the newest page of its filter at once, then
/// again when it changes (a new event); a payload search or a bad filter is
/// refused, a request without a session sent to sign in; and 16 streams at
/// once are all it serves (the 17th is answered 503, and one closed makes room).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn the_live_listing_streams_the_newest_page_and_its_changes_sixteen_at_once(pool: PgPool) {
    use std::time::Duration;
    let c = Console::new(&pool, &pool).await;
    let (cookie, _) = c.session("vic").await;
    failed(&pool, 2).await;
    let open = |path: &str| {
        let req = Request::get(path)
            .header(header::HOST, "console.test")
            .header(header::COOKIE, format!("inbox_console={cookie}"))
            .body(Body::empty())
            .unwrap();
        c.router.clone().oneshot(req)
    };
    // Reads the stream until what it has read holds `needle`.
    async fn until(body: &mut Body, needle: &str) -> String {
        let mut read = String::new();
        while !read.contains(needle) {
            let frame = tokio::time::timeout(Duration::from_secs(10), body.frame()).await;
            let frame = frame.unwrap_or_else(|_| panic!("{needle} within 10 s; read: {read}")).unwrap().unwrap();
            read.push_str(&String::from_utf8_lossy(frame.data_ref().unwrap()));
        }
        read
    }
    let r = open("/events/live?provider=stripe").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut body = r.into_body();
    let first = until(&mut body, "evt_1").await;
    assert!(first.starts_with("event: page\n") && first.contains(r#""event_id":"evt_2""#), "{first}");
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, secret_index)
         VALUES ('stripe', 'evt_<b>new</b>', 'invoice.paid', '{}', 'pending', '', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let next = until(&mut body, "evt_<b>new</b>").await;
    assert!(
        next.contains(r#""status":"pending""#) && next.contains(r#""href":"/event?provider=stripe&id=evt_%3Cb%3Enew"#),
        "{next}"
    );

    for (path, status) in [
        ("/events/live?q=pi_1", StatusCode::BAD_REQUEST),
        ("/events/live?status=exploded", StatusCode::BAD_REQUEST),
        ("/events/live?after=bm90IGEgY3Vyc29y", StatusCode::BAD_REQUEST),
    ] {
        assert_eq!(open(path).await.unwrap().status(), status, "{path}");
    }
    let unsigned = c.send("GET", "/events/live", None, None).await;
    assert_eq!((unsigned.status, unsigned.location.as_str()), (StatusCode::SEE_OTHER, "/signin?next=%2Fevents%2Flive"));

    let mut held = vec![body];
    for _ in 1..16 {
        let r = open("/events/live").await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        held.push(r.into_body());
    }
    let refused = open("/events/live").await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE, "the 17th stream at once");
    held.pop();
    assert_eq!(open("/events/live").await.unwrap().status(), StatusCode::OK, "one closed makes room");
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

/// The console's settings as `env` gives them.
pub(crate) fn settings(env: &Env) -> console::Settings {
    console::Settings::read(env).unwrap()
}
