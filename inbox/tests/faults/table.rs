//! The fault table: each scenario run against the whole stack, its figures
//! checked and written to docs/reliability.md.

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use webhook_inbox::{config::Env, PruneConfig, Pruner, Stage};

use super::{full, pause, scenario, size, storm::Rng, Figures, Route, Stack, GROUPS};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_table() {
    let mut rows = Vec::new();

    rows.extend(
        scenario("kill -9 mid-storm", size(), Route::Direct, &[], |ctx| async move {
            let mut rng = Rng(7);
            let mut kills = 0;
            while ctx.storming() {
                tokio::time::sleep(pause(&mut rng)).await;
                ctx.kill9_and_restart().await;
                kills += 1;
            }
            format!(
                "inbox dev (receive, process, relay) killed with SIGKILL {kills} times at random moments and restarted"
            )
        })
        .await,
    );

    rows.extend(
        scenario("kill -9 with the relay mid-pipeline", size(), Route::Direct, &[], |ctx| async move {
            let pool = webhook_inbox::config::DbConfig::with_url(&ctx.link.url).pool().unwrap();
            let in_flight = "SELECT count(*) FROM transactional_outbox
                             WHERE processed_at IS NULL AND dead_at IS NULL AND attempts > 0 AND next_attempt_at > now()";
            let (mut kills, mut caught) = (0, 0i64);
            while ctx.storming() {
                // Killed only while messages are leased and on their way to the consumer.
                let leased: i64 = sqlx::query_scalar(in_flight).fetch_one(&pool).await.unwrap_or(0);
                if leased == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                ctx.kill9_and_restart().await;
                kills += 1;
                caught += leased;
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            format!("inbox dev killed with SIGKILL {kills} times while the relay had messages leased ({caught} in all), and restarted")
        })
        .await,
    );

    rows.extend(
        scenario("PostgreSQL restarted (immediate)", size(), Route::Direct, &[], |ctx| async move {
            let mut rng = Rng(11);
            let mut restarts = 0;
            let pid = ctx.stack.lock().unwrap().as_ref().unwrap().child.id();
            while ctx.storming() {
                tokio::time::sleep(pause(&mut rng)).await;
                let mut pg = ctx.pg.lock().unwrap();
                // The lock is held across the restart on purpose: nothing else uses the cluster handle.
                block_on(pg.crash());
                std::thread::sleep(Duration::from_millis(300));
                block_on(pg.resume());
                restarts += 1;
            }
            let still = ctx.stack.lock().unwrap().as_ref().unwrap().child.id();
            assert_eq!(pid, still, "the stack recovered without a restart of its own");
            format!(
                "PostgreSQL stopped in immediate mode and started again {restarts} times; the stack never restarted"
            )
        })
        .await,
    );

    rows.extend(
        scenario("connection cut after COMMIT", size(), Route::Cutting, &[], |ctx| async move {
            while ctx.storming() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let cuts = ctx.cuts.load(Ordering::SeqCst);
            assert!(cuts > 0, "the proxy cut no connection");
            format!(
                "a proxy between inbox dev and PostgreSQL forwarded a COMMIT (or the Sync that ends a \
                 statement) and cut the connection before the answer, {cuts} times"
            )
        })
        .await,
    );

    rows.extend(
        scenario("frozen worker", size(), Route::Direct, &[], |ctx| async move {
            // A second stack, its worker competing for the same rows, frozen (SIGSTOP) past
            // idle_in_transaction_session_timeout (1 s) again and again; the storm goes to the first.
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let (link, sink) = (ctx.link.clone(), ctx.sink.clone());
            let frozen = tokio::task::spawn_blocking(move || Stack::start(&link, &sink, port)).await.unwrap();
            let mut rng = Rng(13);
            let mut freezes = 0;
            while ctx.storming() {
                tokio::time::sleep(Duration::from_millis(100 + rng.below(300) as u64)).await;
                frozen.signal("-STOP");
                tokio::time::sleep(Duration::from_millis(1500 + rng.below(1000) as u64)).await;
                frozen.signal("-CONT");
                freezes += 1;
            }
            drop(frozen);
            format!(
                "a second inbox dev, its worker competing for the same rows, frozen with SIGSTOP for 1.5 to 2.5 s \
                 (idle_in_transaction_session_timeout 1 s) {freezes} times, then thawed"
            )
        })
        .await,
    );

    rows.extend(
        scenario("prune during ingestion", size(), Route::Direct, &[], |ctx| async move {
            let pool = webhook_inbox::config::DbConfig::with_url(&ctx.link.url).pool().unwrap();
            // A trigger notes every row deleted while pending, or inside its retention (31 days).
            sqlx::raw_sql(
                "CREATE TABLE prune_violations (provider text, event_id text, status text, received_at timestamptz);
                 CREATE FUNCTION note_violation() RETURNS trigger AS $$ BEGIN
                   IF OLD.status = 'pending' OR OLD.received_at > now() - interval '31 days' THEN
                     INSERT INTO prune_violations VALUES (OLD.provider, OLD.event_id, OLD.status, OLD.received_at);
                   END IF;
                   RETURN OLD;
                 END $$ LANGUAGE plpgsql;
                 CREATE TRIGGER watch_deletes BEFORE DELETE ON webhook_inbox
                   FOR EACH ROW EXECUTE FUNCTION note_violation();
                 -- Old rows to prune (done, 40 days old), old pending ones (never deleted while
                 -- pending), and done ones inside the retention (20 days old: kept).
                 INSERT INTO webhook_inbox
                     (provider, event_id, event_type, payload, status, raw_body, secret_index, received_at, processed_at)
                 SELECT (ARRAY['stripe','shopify','github'])[1 + i % 3], 'seed_old_' || i, 'seed.unknown', '{}',
                        CASE WHEN i % 20 = 0 THEN 'pending' ELSE 'done' END, '{}', 0, now() - interval '40 days',
                        CASE WHEN i % 20 = 0 THEN NULL ELSE now() - interval '40 days' END
                 FROM generate_series(1, 3000) AS i;
                 INSERT INTO webhook_inbox
                     (provider, event_id, event_type, payload, status, raw_body, secret_index, received_at, processed_at)
                 SELECT 'stripe', 'seed_kept_' || i, 'seed.unknown', '{}', 'done', '{}', 0, now() - interval '20 days',
                        now() - interval '20 days'
                 FROM generate_series(1, 200) AS i;",
            )
            .execute(&pool)
            .await
            .unwrap();
            let env = [("INBOX_RETENTION_DAYS", "31"), ("INBOX_FAILED_RETENTION_DAYS", "31"), ("INBOX_PRUNE_BATCH", "50")];
            let pruner = Pruner::new(pool.clone(), PruneConfig::read(&Env::from_pairs(&env)).unwrap());
            let (mut passes, mut pruned) = (0, 0);
            while ctx.storming() {
                pruned += pruner.run(Instant::now() + Duration::from_secs(5)).await.unwrap().done;
                passes += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let violations: i64 =
                sqlx::query_scalar("SELECT count(*) FROM prune_violations").fetch_one(&pool).await.unwrap();
            assert_eq!(violations, 0, "prune deleted a pending row or one inside its retention");
            let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE event_id LIKE 'seed_kept_%'")
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(kept, 200, "rows inside the retention stay");
            assert!(pruned > 0, "prune did its work");
            // The seeded rows are not the storm's: out of the way of its checks.
            sqlx::raw_sql("DROP TRIGGER watch_deletes ON webhook_inbox; DELETE FROM webhook_inbox WHERE event_id LIKE 'seed_%';")
                .execute(&pool)
                .await
                .unwrap();
            format!(
                "prune ran {passes} times alongside (retention 30 days, 50 rows a statement) over 3,200 seeded rows: \
                 {pruned} old done rows deleted, none pending, none inside the retention (a trigger watched every delete)"
            )
        })
        .await,
    );

    rows.extend(
        scenario("PgBouncer restarted (transaction pooling)", size(), Route::PgBouncer, &[], |ctx| async move {
            let mut rng = Rng(17);
            let mut restarts = 0;
            let bouncer = ctx.bouncer.clone().expect("the scenario runs behind PgBouncer");
            while ctx.storming() {
                tokio::time::sleep(pause(&mut rng)).await;
                let bouncer = bouncer.clone();
                tokio::task::spawn_blocking(move || bouncer.lock().unwrap().restart()).await.unwrap();
                restarts += 1;
            }
            let log = bouncer.lock().unwrap().log();
            assert!(!log.contains("prepared statement"), "a prepared-statement error behind the pooler:\n{log}");
            format!(
                "inbox dev (INBOX_DB_POOLER=proxy) behind PgBouncer 1.18 in transaction pooling, its 16 connections \
                 sharing 4 server sessions; PgBouncer killed with SIGKILL and started again {restarts} times"
            )
        })
        .await,
    );

    rows.extend(
        scenario("kill -9 with group commits in flight", size(), Route::Direct, GROUPS, |ctx| async move {
            let mut rng = Rng(19);
            let (mut kills, mut groups, mut grouped) = (0, 0.0, 0.0);
            while ctx.storming() {
                tokio::time::sleep(pause(&mut rng)).await;
                let (link, sink, port, stack) = (ctx.link.clone(), ctx.sink.clone(), ctx.port, ctx.stack.clone());
                let (count, sum) = tokio::task::spawn_blocking(move || {
                    // How many groups this incarnation committed, and how many deliveries they held.
                    let metrics = inbox_tests::http_exchange(
                        &format!("127.0.0.1:{port}"),
                        &format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
                    )
                    .1;
                    let series = |name: &str| {
                        metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok()).unwrap_or(0.0)
                    };
                    let mut guard = stack.lock().unwrap();
                    if let Some(mut s) = guard.take() {
                        s.kill9();
                    }
                    *guard = Some(Stack::start(&link, &sink, port));
                    (series("webhook_inbox_receive_group_size_count"), series("webhook_inbox_receive_group_size_sum"))
                })
                .await
                .unwrap();
                kills += 1;
                groups += count;
                grouped += sum;
            }
            assert!(grouped > groups, "no group held more than one delivery ({grouped} deliveries in {groups} groups)");
            format!(
                "inbox dev with group commit held open 3 ms on one committer (INBOX_GROUP_COMMIT_WAIT_US=3000), killed \
                 with SIGKILL {kills} times at random moments and restarted; before each kill, {:.1} deliveries a \
                 group on average ({grouped} in {groups} groups)",
                grouped / groups.max(1.0)
            )
        })
        .await,
    );

    if full() {
        write_reliability(&rows);
    }
}

/// Runs a future to completion on the current (blocking-allowed) thread.
fn block_on<F: std::future::Future<Output = anyhow::Result<()>>>(f: F) {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f)).unwrap();
}

fn write_reliability(rows: &[Figures]) {
    assert_eq!(rows.len(), 7, "the table is written from every scenario");
    let mut doc = String::from(
        "# Reliability\n\n\
         The fault suite (`inbox/tests/faults/`) at its full size, run with\n\
         `INBOX_FAULTS=full cargo test -p inbox --test faults -- --nocapture` on the\n\
         2-core development machine. Each scenario sends the storm of `inbox demo`\n\
         (concurrent copies, late retries, Stripe twin events, Shopify snapshots out of\n\
         order, Marqeta batches with repeats, forgeries, a poison event) as providers\n\
         do, every delivery again until it is acknowledged, to `inbox dev` on a\n\
         throwaway PostgreSQL cluster of its own, while the fault is injected; then\n\
         the database is checked against what was sent. **Lost**: acknowledged events\n\
         missing from the inbox. **Duplicated effects**: outbox messages sharing a key,\n\
         or balances above the sum of unique deposits. **Recovered**: deliveries that\n\
         failed at least once (no answer, or 503) and were acknowledged later; **503**:\n\
         answers saying nothing was stored, retry (never a 200 for an uncommitted row);\n\
         **re-sent**: outbox messages the consumer got again under the same key.\n\
         Forged deliveries are sent too and refused: deliveries sent less acknowledged.\n\n\
         | scenario | injected | deliveries sent | acknowledged | lost | duplicated effects | recovered | 503 | re-sent | time (s) |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in rows {
        doc.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario,
            r.injected,
            r.deliveries,
            r.acknowledged,
            r.lost,
            r.duplicated,
            r.recovered,
            r.unavailable,
            r.resent,
            r.seconds
        ));
    }
    doc.push_str(
        "\nA relay killed between publishing and marking a message (inside the kill -9\n\
         scenario) sends it again under the same key once its lease ends; the consumer\n\
         received every message. The integration suite also runs on PostgreSQL 18\n\
         (`scripts/pg18`), and every stage runs behind PgBouncer in transaction and\n\
         session pooling (`tests/pooler.rs`).\n",
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reliability.md");
    std::fs::write(path, doc).unwrap();
}
