//! Who may call the management API and how much: a token's rate, a
//! client's failed authentications kept apart from any token's allowance,
//! and payload searches that never hold the pool (`api_access`).

use std::time::Duration;

use http::{header, StatusCode};
use sqlx::PgPool;

use crate::api::{tokens, Api};

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn each_token_is_rate_limited_on_its_own(pool: PgPool) {
    let api = Api::new(&pool, "", &[("INBOX_API_RATE_PER_SECOND", "2")]);
    let (operator, viewer) = tokens(&pool).await;
    for _ in 0..4 {
        assert_eq!(api.call("GET", "/api/v1/jobs", Some(&operator), None).await.status, StatusCode::OK);
    }
    let limited = api.call("GET", "/api/v1/jobs", Some(&operator), None).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers[header::RETRY_AFTER], "1");
    assert_eq!(api.call("GET", "/api/v1/jobs", Some(&viewer), None).await.status, StatusCode::OK);
}

/// Behind a balancer every client has its address: a stranger's failed
/// tokens there throttle failures from it, and never a valid token, whose
/// allowance is its own (the audit's lockout: ~40 bad tokens, then 429 for all).
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_stranger_s_failed_tokens_never_lock_out_a_valid_token_from_the_same_address(pool: PgPool) {
    let api = Api::new(&pool, "", &[]);
    let (operator, _) = tokens(&pool).await;
    let balancer = Some("10.0.0.1");
    let mut throttled = 0;
    for i in 0..100 {
        let forged = format!("Bearer inbox_forged{i}");
        let authorization = if i % 2 == 0 { Some(forged.as_str()) } else { None };
        let a = api.call_as(balancer, "GET", "/api/v1/events", authorization, None).await;
        match a.status {
            StatusCode::UNAUTHORIZED => {}
            StatusCode::TOO_MANY_REQUESTS => {
                throttled += 1;
                let error = a.body["error"].as_str().unwrap();
                assert!(error.contains("failed authentications from this address"), "{error}");
                assert!(a.headers.contains_key(header::RETRY_AFTER));
            }
            other => panic!("{other}"),
        }
    }
    assert!(throttled >= 70, "{throttled}: failures past the allowance are throttled");
    // The operator's valid token, from the same address, in any case of the scheme: served, every time.
    for scheme in ["Bearer", "bearer", "BEARER"].iter().cycle().take(30) {
        let authorization = format!("{scheme} {operator}");
        let a = api.call_as(balancer, "GET", "/api/v1/jobs", Some(&authorization), None).await;
        assert_eq!(a.status, StatusCode::OK, "{scheme}: {}", a.body);
    }
    // Another address's failures are its own.
    let elsewhere = api.call_as(Some("10.0.0.2"), "GET", "/api/v1/events", Some("Bearer inbox_forged"), None).await;
    assert_eq!(elsewhere.status, StatusCode::UNAUTHORIZED);
    // A token's own rate says so, in its own words.
    let mut limited = None;
    for _ in 0..100 {
        let a = api.call("GET", "/api/v1/jobs", Some(&operator), None).await;
        if a.status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(a);
            break;
        }
    }
    let limited = limited.expect("past its burst, a token waits");
    assert!(limited.body["error"].as_str().unwrap().contains("for this token"), "{}", limited.body);
}

/// A viewer running payload searches at once (each may take its timeout on a
/// connection) holds one search, never the pool: the operator's call is served
/// while it runs, and the viewer's others are refused at once.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_viewer_s_payload_searches_never_hold_the_connections_an_operator_needs(
    _: sqlx::postgres::PgPoolOptions,
    opts: sqlx::postgres::PgConnectOptions,
) {
    use sqlx::Connection as _;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(opts.clone())
        .await
        .unwrap();
    let api = std::sync::Arc::new(Api::new(&pool, "", &[]));
    let (operator, viewer) = tokens(&pool).await;
    // Every search waits on a lock another session holds, until its timeout.
    let mut locker = sqlx::PgConnection::connect_with(&opts).await.unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE").execute(&mut locker).await.unwrap();
    let searches: Vec<_> = (0..4)
        .map(|_| {
            let (api, viewer) = (api.clone(), viewer.clone());
            tokio::spawn(async move {
                let a = api.call("GET", "/api/v1/events?payload=jane%40example.com", Some(&viewer), None).await;
                (a.status, std::time::Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let jobs = api.call("GET", "/api/v1/jobs", Some(&operator), None).await;
    let answered = std::time::Instant::now();
    assert_eq!(jobs.status, StatusCode::OK);
    let mut ran = Vec::new();
    let mut refused = 0;
    for s in searches {
        match s.await.unwrap() {
            (StatusCode::TOO_MANY_REQUESTS, _) => refused += 1,
            (StatusCode::SERVICE_UNAVAILABLE, at) => ran.push(at),
            (other, _) => panic!("{other}"),
        }
    }
    assert_eq!((ran.len(), refused), (1, 3), "one search runs (and times out on the lock), the others wait their turn");
    assert!(answered < ran[0], "the operator was answered while the viewer's search still held its connection");
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
}
