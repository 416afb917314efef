//! `ops::list_events`, the console's listing: newest first, every filter, and
//! keyset pages that neither skip nor repeat an event, whatever ties, ids and
//! concurrent arrivals there are.

use inbox_tests::MIGRATOR;
use sqlx::PgPool;
use webhook_inbox::ops::{list_events, status_counts, Count, Cursor, EventQuery, IdMatch, Since, Status};

/// `n` events over a few providers, types and statuses, many received at the
/// same microsecond (ties the order breaks by provider and id).
async fn seed(pool: &PgPool, n: i32) {
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, received_at, processed_at,
                                    raw_body, secret_index, failure_reason)
         SELECT (ARRAY['stripe', 'shopify', 'github'])[1 + i % 3],
                'evt_' || lpad((i % 97)::text, 3, '0') || '_' || i,
                (ARRAY['invoice.paid', 'orders/paid'])[1 + i % 2],
                '{}', s, '2026-11-01 00:00:00+00'::timestamptz + (i / 4) * interval '1 second',
                CASE WHEN s = 'pending' THEN NULL ELSE now() END,
                '\\x7b7d', 0, CASE WHEN s = 'failed' THEN 'it failed' END
         FROM generate_series(1, $1) AS i,
              LATERAL (SELECT (ARRAY['done', 'failed', 'unhandled', 'pending'])[1 + i % 4] AS s) AS st",
    )
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// Every page of `query`, `limit` at a time, as (provider, event_id).
async fn walk(pool: &PgPool, query: &EventQuery, limit: i64) -> Vec<(String, String)> {
    let (mut all, mut after): (Vec<(String, String)>, Option<Cursor>) = (vec![], None);
    loop {
        let page = list_events(pool, query, after.as_ref(), limit).await.unwrap();
        assert!(page.events.len() as i64 <= limit);
        all.extend(page.events.iter().map(|e| (e.provider.clone(), e.event_id.clone())));
        // The cursor goes out as text (a URL's query) and comes back.
        match page.next {
            Some(next) => {
                assert_ne!(Some(&next), after.as_ref(), "a page moves the cursor on");
                after = Some(Cursor::parse(&next.to_string()).unwrap());
            }
            None => return all,
        }
    }
}

/// The same selection in one query, as the truth to compare the pages with.
async fn truth(pool: &PgPool, filter: &str) -> Vec<(String, String)> {
    sqlx::query_as(&format!(
        "SELECT provider, event_id FROM webhook_inbox WHERE {filter}
         ORDER BY received_at DESC, provider DESC, event_id DESC"
    ))
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "MIGRATOR")]
async fn pages_neither_skip_nor_repeat_an_event_under_every_filter(pool: PgPool) {
    seed(&pool, 400).await;
    let cases: Vec<(EventQuery, &str)> = vec![
        (EventQuery::default(), "true"),
        (EventQuery { provider: Some("shopify".into()), ..Default::default() }, "provider = 'shopify'"),
        (EventQuery { event_type: Some("orders/paid".into()), ..Default::default() }, "event_type = 'orders/paid'"),
        (
            EventQuery { statuses: vec![Status::Failed, Status::Unhandled], ..Default::default() },
            "status IN ('failed', 'unhandled')",
        ),
        (
            EventQuery {
                since: Some(Since::At("2026-11-01 00:00:20Z".into())),
                until: Some(Since::At("2026-11-01 00:01:00Z".into())),
                ..Default::default()
            },
            "received_at >= '2026-11-01 00:00:20Z' AND received_at < '2026-11-01 00:01:00Z'",
        ),
        (
            EventQuery { event_id: Some(IdMatch::Prefix("evt_01".into())), ..Default::default() },
            "event_id LIKE 'evt\\_01%'",
        ),
        (
            EventQuery {
                provider: Some("github".into()),
                statuses: vec![Status::Done],
                event_id: Some(IdMatch::Prefix("evt_0".into())),
                ..Default::default()
            },
            "provider = 'github' AND status = 'done' AND event_id LIKE 'evt\\_0%'",
        ),
    ];
    for (query, filter) in cases {
        let expected = truth(&pool, filter).await;
        assert!(!expected.is_empty(), "{filter} selects something");
        for limit in [1, 7, 500] {
            assert_eq!(walk(&pool, &query, limit).await, expected, "{filter}, {limit} a page");
        }
    }
    // An exact id is that one event, and no other that starts with it.
    let exact = EventQuery { event_id: Some(IdMatch::Exact("evt_001_1".into())), ..Default::default() };
    assert_eq!(walk(&pool, &exact, 10).await, vec![("shopify".to_string(), "evt_001_1".to_string())]);
}

/// A prefix is text: a stranger's `%` or `_` is that character, not a pattern.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_prefix_is_taken_as_text(pool: PgPool) {
    seed(&pool, 8).await;
    for id in ["a%b", "a_c", "abc", "a\\d", "a%"] {
        sqlx::query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index)
             VALUES ('stripe', $1, 't', '{}', '\\x7b7d', 0)",
        )
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    }
    let ids = |prefix: &str| {
        let query = EventQuery { event_id: Some(IdMatch::Prefix(prefix.into())), ..Default::default() };
        let pool = pool.clone();
        async move {
            let mut ids: Vec<String> = walk(&pool, &query, 3).await.into_iter().map(|(_, id)| id).collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(ids("a%").await, ["a%", "a%b"]);
    assert_eq!(ids("a_").await, ["a_c"]);
    assert_eq!(ids("a\\").await, ["a\\d"]);
    assert_eq!(ids("a").await.len(), 5);
}

/// Events that arrive while someone pages through never shift a page: the
/// pages after the first are the ones there were.
#[sqlx::test(migrator = "MIGRATOR")]
async fn arrivals_do_not_shift_the_pages(pool: PgPool) {
    seed(&pool, 60).await;
    let before = truth(&pool, "true").await;
    let query = EventQuery::default();
    let first = list_events(&pool, &query, None, 10).await.unwrap();
    for i in 0..25 {
        sqlx::query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index)
             VALUES ('stripe', $1, 't', '{}', '\\x7b7d', 0)",
        )
        .bind(format!("new_{i}"))
        .execute(&pool)
        .await
        .unwrap();
    }
    let mut seen: Vec<(String, String)> =
        first.events.iter().map(|e| (e.provider.clone(), e.event_id.clone())).collect();
    let mut after = first.next;
    while let Some(cursor) = after {
        let page = list_events(&pool, &query, Some(&cursor), 10).await.unwrap();
        seen.extend(page.events.iter().map(|e| (e.provider.clone(), e.event_id.clone())));
        after = page.next;
    }
    assert_eq!(seen, before);
}

/// A cursor a caller made up is refused as one, never a panic; one that
/// decodes but names no timestamp is PostgreSQL's error.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_forged_cursor_is_refused(pool: PgPool) {
    seed(&pool, 4).await;
    for bad in ["", "not base64!", "e30", "WyJ4Il0", &"A".repeat(10_000)] {
        assert!(Cursor::parse(bad).is_err(), "{bad:?}");
    }
    // {"received_at":"yesterday-ish","provider":"x","event_id":"y"}
    use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
    let forged = URL_SAFE_NO_PAD.encode(br#"{"received_at":"not a time","provider":"x","event_id":"y"}"#);
    let cursor = Cursor::parse(&forged).unwrap();
    let e = list_events(&pool, &EventQuery::default(), Some(&cursor), 10).await.unwrap_err();
    assert!(e.to_string().contains("invalid input syntax for type timestamp"), "{e}");
}

/// The counts at the console's top: exact in the partial indexes up to the
/// cap, at least the cap past it, and `done` as the estimate less the others.
#[sqlx::test(migrator = "MIGRATOR")]
async fn status_counts_are_exact_where_cheap_and_say_so_where_not(pool: PgPool) {
    seed(&pool, 400).await; // a quarter in each status
    sqlx::query("ANALYZE webhook_inbox").execute(&pool).await.unwrap();
    let counts = status_counts(&pool, 1000).await.unwrap();
    assert_eq!(
        counts,
        [
            (Status::Pending, Count::Exact(100)),
            (Status::Failed, Count::Exact(100)),
            (Status::Unhandled, Count::Exact(100)),
            (Status::Ignored, Count::Exact(0)),
            (Status::Done, Count::Exact(100)),
        ]
    );
    let capped = status_counts(&pool, 99).await.unwrap();
    assert_eq!(capped[1], (Status::Failed, Count::AtLeast(99)));
    assert_eq!(capped[4], (Status::Done, Count::About(400 - 3 * 99)), "past the cap, the estimate less the others");
    let estimated = status_counts(&pool, 10).await.unwrap();
    assert_eq!(estimated[4], (Status::Done, Count::About(400 - 3 * 10)));
    // New rows the estimate has not seen yet: counted, up to the cap, and never
    // said to be fewer than it (a table never analyzed estimates none).
    sqlx::query("TRUNCATE webhook_inbox").execute(&pool).await.unwrap();
    seed(&pool, 40).await;
    let fresh = status_counts(&pool, 100).await.unwrap();
    assert_eq!(fresh[4], (Status::Done, Count::Exact(10)), "{fresh:?}");
    let fresh = status_counts(&pool, 5).await.unwrap();
    assert_eq!(fresh[4], (Status::Done, Count::About(6)), "at least the cap and one: {fresh:?}");
    sqlx::query("TRUNCATE webhook_inbox").execute(&pool).await.unwrap();
    let empty = status_counts(&pool, 10).await.unwrap();
    assert!(empty.iter().all(|(_, c)| *c == Count::Exact(0)), "{empty:?}");
}

/// A payload search: text anywhere in the payload's JSON, or JSON it contains,
/// within the other filters, paged like any listing.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_payload_search_finds_text_or_contained_json(pool: PgPool) {
    use webhook_inbox::ops::PayloadMatch;
    seed(&pool, 40).await;
    for (id, payload) in [
        ("evt_pi_1", r#"{"data": {"object": {"id": "pi_1", "customer": "cus_9"}}}"#),
        ("evt_pi_12", r#"{"data": {"object": {"id": "pi_12", "customer": "cus_9"}}}"#),
        ("evt_other", r#"{"data": {"object": {"id": "ch_1", "note": "about pi_1"}}}"#),
    ] {
        sqlx::query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index)
             VALUES ('stripe', $1, 'payment_intent.succeeded', $2::jsonb, '\\x7b7d', 0)",
        )
        .bind(id)
        .bind(payload)
        .execute(&pool)
        .await
        .unwrap();
    }
    let found = |m: PayloadMatch, since: Option<Since>| {
        let query = EventQuery { payload: Some(m), since, ..Default::default() };
        let pool = pool.clone();
        async move {
            let mut ids: Vec<String> = walk(&pool, &query, 1).await.into_iter().map(|(_, id)| id).collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(found(PayloadMatch::parse("pi_1"), None).await, ["evt_other", "evt_pi_1", "evt_pi_12"], "text anywhere");
    assert_eq!(found(PayloadMatch::parse(r#""id": "pi_1""#), None).await, ["evt_pi_1"], "as jsonb writes it");
    let json = PayloadMatch::parse(r#"{"data": {"object": {"id": "pi_1"}}}"#);
    assert!(matches!(json, PayloadMatch::Json(_)));
    assert_eq!(found(json, None).await, ["evt_pi_1"], "contained JSON, at its place");
    assert_eq!(
        found(PayloadMatch::parse(r#"{"data":{"object":{"customer":"cus_9"}}}"#), None).await,
        ["evt_pi_1", "evt_pi_12"]
    );
    assert_eq!(found(PayloadMatch::parse("100%_\\"), None).await, Vec::<String>::new(), "% and _ are themselves");
    assert_eq!(
        found(PayloadMatch::parse("pi_1"), Some(Since::Ago(std::time::Duration::from_secs(3600)))).await.len(),
        3,
        "within the time bound"
    );
    assert!(found(PayloadMatch::parse("pi_1"), Some(Since::At("2100-01-01Z".into()))).await.is_empty());
}

/// A payload search that cannot finish in time is stopped by PostgreSQL
/// (here it waits on a lock that another transaction holds), with 57014.
#[sqlx::test(migrator = "MIGRATOR")]
async fn a_payload_search_stops_at_its_timeout(pool: PgPool) {
    use webhook_inbox::ops::{PayloadMatch, SEARCH_TIMEOUT};
    seed(&pool, 4).await;
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE").execute(&mut *holder).await.unwrap();
    let query = EventQuery { payload: Some(PayloadMatch::parse("anything")), ..Default::default() };
    let started = std::time::Instant::now();
    let err = list_events(&pool, &query, None, 10).await.unwrap_err();
    assert_eq!(webhook_inbox::ops::sqlstate(&err).as_deref(), Some("57014"), "{err}");
    // PostgreSQL times the statement by its own clock (the wall clock), not
    // ours: a CI run saw 2.996 s of a 3 s timeout on our monotonic one.
    let elapsed = started.elapsed();
    assert!(elapsed >= SEARCH_TIMEOUT * 9 / 10 && elapsed < SEARCH_TIMEOUT * 3, "{elapsed:?}");
    holder.rollback().await.unwrap();
    // The timeout was the search's transaction's own: the next listing runs without it.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE webhook_inbox IN ACCESS EXCLUSIVE MODE").execute(&mut *holder).await.unwrap();
    let plain = tokio::time::timeout(SEARCH_TIMEOUT * 2, list_events(&pool, &EventQuery::default(), None, 10)).await;
    assert!(plain.is_err(), "a listing without a search keeps the session's own timeout");
    holder.rollback().await.unwrap();
}
