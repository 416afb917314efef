//! The console's sign-in and sessions: each client limited on its own behind
//! a balancer, guesses counted before any password is checked, lockouts that
//! lock out only strangers, idle timeouts, each user's sessions, HTTPS cookies.

use axum::body::Body;
use http::{header, Request, StatusCode};
use sqlx::PgPool;
use tower::ServiceExt as _;
use webhook_inbox_console as console;

use crate::console::{form, scalar, Console};

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
