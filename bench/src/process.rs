//! The worker against graphile-worker: draining, seeding pending and retained events.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use super::*;

impl Bench {
    /// The worker with no handler on an empty inbox (no retained row), a round each: events/s.
    pub(super) async fn process_empty(&self, pool: &PgPool) -> Result<Vec<f64>> {
        let mut rates = Vec::new();
        for round in 1..=self.rounds {
            clean(pool).await?;
            seed(pool, self.events, false).await?;
            let rate = self.drain(pool, false).await?;
            self.round(format_args!(
                "process, {} events, no handler, empty inbox, round {round}: {rate:.0} events/s",
                self.events
            ));
            rates.push(rate);
        }
        Ok(rates)
    }

    /// Drains `events` pending events with no handler, then with the stock
    /// handlers, on the inbox holding the retained rows, against graphile-worker
    /// (as many processes as we have workers).
    pub(super) async fn process(&self, pool: &PgPool, url: &str, empty: Vec<f64>, report: &mut Report) -> Result<()> {
        // One account per ten deposits: workers meet on an account now and then, not on every batch.
        sqlx::query(
            "INSERT INTO accounts (account_id) SELECT 'acct_bench_' || i FROM generate_series(0, $1 - 1) AS i
             ON CONFLICT DO NOTHING",
        )
        .bind(accounts(self.events))
        .execute(pool)
        .await?;
        let gw = GraphileWorker::install(url).await?;
        let w = self.workers;
        let mut peer = Figure::new(
            format!(
                "graphile-worker {GRAPHILE_WORKER}, {} no-op jobs, {w} processes of 24 jobs, a database of its own",
                self.events
            ),
            "jobs/s",
        );
        let retained = self.retained;
        let mut on_empty =
            Figure::new(format!("process, {} events, no handler, {w} workers, empty inbox", self.events), "events/s");
        on_empty.values = empty;
        let mut bare = Figure::new(
            format!("process, {} events, no handler, {w} workers, {retained} retained", self.events),
            "events/s",
        );
        let mut stock = Figure::new(
            format!(
                "process, {} events, stock handlers (payments, orders, deposits), {w} workers, {retained} retained",
                self.events
            ),
            "events/s",
        );
        for round in 1..=self.rounds {
            let jobs = gw.drain(self.events, w).await?;
            self.round(format_args!("{}, round {round}: {jobs:.0} jobs/s", peer.name));
            peer.values.push(jobs);
            for (figure, handlers) in [(&mut bare, false), (&mut stock, true)] {
                clean(pool).await?;
                seed(pool, self.events, handlers).await?;
                // Each side starts settled, as graphile-worker's does.
                sqlx::raw_sql("CHECKPOINT").execute(pool).await?;
                let rate = self.drain(pool, handlers).await?;
                self.round(format_args!("{}, round {round}: {rate:.0} events/s", figure.name));
                figure.values.push(rate);
            }
        }
        gw.drop_database(pool).await?;
        let per_round = |f: &Figure| f.values.iter().zip(&peer.values).map(|(a, b)| a / b).collect::<Vec<_>>();
        report.checks.push(Check {
            values: per_round(&bare),
            ..Check::at_least(
                format!("process (no handler, {retained} retained) / graphile-worker (no-op jobs), {w} a side"),
                1.5,
            )
        });
        report.checks.push(Check {
            values: per_round(&stock),
            ..Check::at_least(
                format!("process (stock handlers, {retained} retained) / graphile-worker (no-op jobs), {w} a side"),
                1.0,
            )
        });
        report.sections.push((
            format!("Process, {w} workers against {w} graphile-worker processes"),
            vec![peer, on_empty, bare, stock],
        ));
        Ok(())
    }

    /// The worker with no handler on an empty inbox and on one holding
    /// `growth_rows` retained events, each in a freshly migrated schema of its
    /// own, alternated round by round. The retained window is vacuumed and
    /// checkpointed before the first drain: an old window is settled on disk,
    /// and the write-out of a fresh one would be measured instead of the history.
    pub(super) async fn process_history(
        &self,
        pool: &PgPool,
        config: &ReceiveConfig,
        report: &mut Report,
    ) -> Result<()> {
        const EMPTY: &str = "bench_history_empty";
        const FULL: &str = "bench_history_full";
        let rows = self.growth_rows.max(self.retained);
        let size = self.workers as u32 * 2 + 2;
        for schema in [EMPTY, FULL] {
            growth::migrated_schema(pool, &config.db, schema).await?;
        }
        let empty = growth::schema_pool(&config.db, EMPTY, size)?;
        let full = growth::schema_pool(&config.db, FULL, size)?;
        retain(&full, 0, rows).await?;
        sqlx::raw_sql("CHECKPOINT").execute(pool).await?;
        let name = |inbox: String| {
            Figure::new(
                format!("process, {} events, no handler, {} workers, {inbox}", self.events, self.workers),
                "events/s",
            )
        };
        let (mut on_empty, mut on_full) = (name("empty inbox".into()), name(format!("{rows} retained")));
        let mut ratio = Check::at_least(format!("process (no handler), {rows} retained / empty inbox"), 0.9);
        for round in 1..=self.rounds {
            for (p, figure) in [(&empty, &mut on_empty), (&full, &mut on_full)] {
                sqlx::query("DELETE FROM webhook_inbox WHERE event_id LIKE 'bench-%'").execute(p).await?;
                sqlx::raw_sql("VACUUM (ANALYZE) webhook_inbox").execute(p).await?;
                seed(p, self.events, false).await?;
                let rate = self.drain(p, false).await?;
                self.round(format_args!("{}, round {round}: {rate:.0} events/s", figure.name));
                figure.values.push(rate);
            }
            ratio.values.push(on_full.values[round - 1] / on_empty.values[round - 1]);
        }
        empty.close().await;
        full.close().await;
        for schema in [EMPTY, FULL] {
            sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(pool).await?;
        }
        report.checks.push(ratio);
        report
            .sections
            .push((format!("Process as the inbox fills: empty, and {rows} retained"), vec![on_empty, on_full]));
        Ok(())
    }

    /// The worker with no handler draining with a snapshot held open from
    /// before the drain to its end (a long report, an idle transaction, a
    /// lagging replication slot: vacuum may then remove none of the finished
    /// events' index entries), against the same drain without, alternated.
    pub(super) async fn process_snapshot(&self, pool: &PgPool, report: &mut Report) -> Result<()> {
        let name = |how: &str| {
            Figure::new(
                format!(
                    "process, {} events, no handler, {} workers, {} retained, {how}",
                    self.events, self.workers, self.retained
                ),
                "events/s",
            )
        };
        let (mut free, mut held) = (name("no snapshot held"), name("a snapshot held open"));
        let relay_name = |how: &str| {
            Figure::new(format!("relay, {} messages, a sink in its own process, {how}", self.events), "messages/s")
        };
        let (mut relay_free, mut relay_held) = (relay_name("no snapshot held"), relay_name("a snapshot held open"));
        let mut ratio = Check::at_least("process with a snapshot held open / without", 0.7);
        let mut relay_ratio = Check::at_least("relay with a snapshot held open / without", 0.7);
        for round in 1..=self.rounds {
            for (holding, figure) in [(false, &mut free), (true, &mut held)] {
                clean(pool).await?;
                sqlx::raw_sql("VACUUM (ANALYZE) webhook_inbox").execute(pool).await?;
                seed(pool, self.events, false).await?;
                let snapshot = if holding { Some(hold_snapshot(pool).await?) } else { None };
                let rate = self.drain(pool, false).await?;
                if let Some(tx) = snapshot {
                    tx.rollback().await?;
                }
                self.round(format_args!("{}, round {round}: {rate:.0} events/s", figure.name));
                figure.values.push(rate);
            }
            ratio.values.push(held.values[round - 1] / free.values[round - 1]);
            for (holding, figure) in [(false, &mut relay_free), (true, &mut relay_held)] {
                let rate = self.relay_drain(pool, holding).await?;
                self.round(format_args!("{}, round {round}: {rate:.0} messages/s", figure.name));
                figure.values.push(rate);
            }
            relay_ratio.values.push(relay_held.values[round - 1] / relay_free.values[round - 1]);
        }
        report.checks.extend([ratio, relay_ratio]);
        report.sections.push(("A snapshot held open".into(), vec![free, held, relay_free, relay_held]));
        Ok(())
    }

    pub(super) async fn drain(&self, pool: &PgPool, handlers: bool) -> Result<f64> {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(3600);
        let workers: Vec<_> = (0..self.workers)
            .map(|_| {
                let h = if handlers { stock::handlers() } else { Handlers::new() };
                let worker = Worker::new(pool.clone(), h, WorkerConfig::default());
                tokio::spawn(async move { worker.run(deadline).await.map_err(|e| anyhow::anyhow!("{e}")) })
            })
            .collect();
        let mut taken = 0;
        for w in workers {
            taken += w.await??.taken;
        }
        let elapsed = started.elapsed().as_secs_f64();
        // Through the queue's and the failures' partial indexes: the retained rows are not read.
        let left: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM webhook_inbox WHERE status = 'pending' AND event_id LIKE 'bench-%')
                  + (SELECT count(*) FROM webhook_inbox WHERE status = 'failed' AND event_id LIKE 'bench-%')",
        )
        .fetch_one(pool)
        .await?;
        // `taken` may exceed the events: one retried after contention is taken again.
        ensure!(
            left == 0 && taken >= self.events,
            "the drain left {left} events neither done nor unhandled ({taken} taken)"
        );
        Ok(self.events as f64 / elapsed)
    }
}

pub(super) const GRAPHILE_WORKER: &str = "0.17.3";

/// graphile-worker from npm, in a folder of its own under the temporary
/// directory, on a database of its own on the bench's server
/// ([`GRAPHILE_DATABASE`]): nothing else writes there, and nothing the bench
/// retains for the inbox sits beside its jobs.
pub(super) struct GraphileWorker {
    dir: PathBuf,
    /// Its database's URL, for its processes.
    url: String,
    /// Its database, for the bench's checks before and after a drain (never during one).
    pool: PgPool,
}

/// graphile-worker's database, made afresh by each run.
pub(super) const GRAPHILE_DATABASE: &str = "inbox_bench_graphile";

impl GraphileWorker {
    /// Installs graphile-worker if it is not, and makes its database afresh
    /// on the server of `url`.
    pub(super) async fn install(url: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("inbox-bench-graphile-worker-{GRAPHILE_WORKER}"));
        std::fs::create_dir_all(&dir)?;
        if !dir.join("node_modules/graphile-worker/package.json").exists() {
            println!("installing graphile-worker {GRAPHILE_WORKER} from npm into {}", dir.display());
            let out = tokio::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
                .arg(&dir)
                .arg(format!("graphile-worker@{GRAPHILE_WORKER}"))
                .output()
                .await
                .context("running npm (graphile-worker is the process bench's peer)")?;
            ensure!(
                out.status.success(),
                "npm install graphile-worker failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::write(dir.join("graphile.mjs"), include_str!("../graphile.mjs"))?;
        let server = PgPool::connect(url).await.context("connecting to make graphile-worker's database")?;
        for statement in [
            format!("DROP DATABASE IF EXISTS {GRAPHILE_DATABASE} WITH (FORCE)"),
            format!("CREATE DATABASE {GRAPHILE_DATABASE}"),
        ] {
            sqlx::raw_sql(&statement).execute(&server).await.context("making graphile-worker's database")?;
        }
        server.close().await;
        let mut own = url::Url::parse(url).context("DATABASE_URL is not a URL")?;
        own.set_path(&format!("/{GRAPHILE_DATABASE}"));
        let url = own.to_string();
        let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&url).await?;
        Ok(GraphileWorker { dir, url, pool })
    }

    /// Removes its database.
    pub(super) async fn drop_database(self, pool: &PgPool) -> Result<()> {
        self.pool.close().await;
        sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {GRAPHILE_DATABASE} WITH (FORCE)")).execute(pool).await?;
        Ok(())
    }

    pub(super) fn node(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("node");
        cmd.arg(self.dir.join("graphile.mjs")).args(args).kill_on_drop(true);
        cmd
    }

    /// Jobs per second `processes` worker processes drain `n` no-op jobs at:
    /// the jobs seeded in a fresh schema, vacuumed and checkpointed; the
    /// processes started, their pools connected; then timed from the word
    /// to start to the exit of the last (graphile-worker's `runOnce`, which
    /// ends when no job is left), with nothing reading its tables meanwhile.
    pub(super) async fn drain(&self, n: usize, processes: usize) -> Result<f64> {
        sqlx::query("DROP SCHEMA IF EXISTS graphile_worker CASCADE").execute(&self.pool).await?;
        let mut seed = self.node(&["seed", &self.url, &n.to_string()]).stdin(Stdio::piped()).spawn()?;
        {
            let mut stdin = seed.stdin.take().context("seed's stdin")?;
            stdin.write_all(body("bench-gw").as_bytes()).await?;
        }
        ensure!(seed.wait().await?.success(), "graphile-worker's seed failed");
        let count = || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM graphile_worker._private_jobs")
                .fetch_one(&self.pool)
                .await
        };
        ensure!(count().await? == n as i64, "graphile-worker was not given {n} jobs");
        for statement in ["VACUUM (ANALYZE)", "CHECKPOINT"] {
            sqlx::raw_sql(statement).execute(&self.pool).await?;
        }
        let mut workers = Vec::new();
        for _ in 0..processes {
            let mut child = self.node(&["once", &self.url]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
            let mut lines = BufReader::new(child.stdout.take().context("a worker's stdout")?).lines();
            let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
            ensure!(
                matches!(ready, Ok(Ok(Some(ref line))) if line == "ready"),
                "a graphile-worker process did not start: {ready:?}"
            );
            workers.push(child);
        }
        let started = Instant::now();
        for child in &mut workers {
            child.stdin.as_mut().context("a worker's stdin")?.write_all(b"go\n").await?;
        }
        for mut child in workers {
            let exited = tokio::time::timeout(Duration::from_secs(600), child.wait()).await;
            ensure!(
                matches!(exited, Ok(Ok(ref status)) if status.success()),
                "a graphile-worker process did not drain and exit in 10 minutes: {exited:?}"
            );
        }
        let elapsed = started.elapsed().as_secs_f64();
        ensure!(count().await? == 0, "graphile-worker left jobs undone");
        Ok(n as f64 / elapsed)
    }
}

/// A transaction holding a snapshot (repeatable read, its first statement
/// run) until it ends, however long: vacuum keeps every row version it may
/// still see.
pub(super) async fn hold_snapshot(pool: &PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SET LOCAL idle_in_transaction_session_timeout = 0")
        .execute(&mut *tx)
        .await?;
    let (_,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM webhook_inbox WHERE status = 'pending'").fetch_one(&mut *tx).await?;
    Ok(tx)
}

/// `n` pending events: with `handlers`, a third each of Stripe payments,
/// Shopify order snapshots and Marqeta deposits (every one with an effect and
/// an outbox message); without, events no handler takes. Same size either way.
pub(super) async fn seed(pool: &PgPool, n: usize, handlers: bool) -> Result<()> {
    let pad = "x".repeat(1100);
    let sql = if handlers {
        format!(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index)
             SELECT p, 'bench-' || i, t, j, 'pending', convert_to(j::text, 'UTF8'), '{{}}', 0
             FROM generate_series(1, $1) AS i,
             LATERAL (SELECT CASE i % 3 WHEN 0 THEN 'stripe' WHEN 1 THEN 'shopify' ELSE 'marqeta' END AS p) AS provider,
             LATERAL (SELECT CASE p WHEN 'stripe' THEN '{pay}' WHEN 'shopify' THEN 'orders/updated' ELSE '{dep}' END AS t) AS type,
             LATERAL (SELECT CASE p
                 WHEN 'stripe' THEN jsonb_build_object('id', 'bench-' || i, 'type', '{pay}', 'data', jsonb_build_object('object',
                     jsonb_build_object('id', 'pi_bench_' || i, 'amount_received', 2000, 'currency', 'usd', 'note', '{pad}')))
                 WHEN 'shopify' THEN jsonb_build_object('id', 7000000000 + i, 'financial_status', 'paid', 'total_price', '20.00',
                     'updated_at', '2026-11-30T08:00:00Z', 'note', '{pad}')
                 ELSE jsonb_build_object('token', 'dep_bench_' || i, 'type', 'gpa.credit', 'state', 'COMPLETION',
                     'user_token', 'acct_bench_' || (i % {accounts}), 'amount', '1.00', 'note', '{pad}')
                 END AS j) AS payload",
            pay = payments::EVENT_TYPE,
            dep = deposits::EVENT_TYPE,
            accounts = accounts(n),
        )
    } else {
        format!(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index)
             SELECT 'stripe', 'bench-' || i, 'bench.no_handler', j, 'pending', convert_to(j::text, 'UTF8'), '{{}}', 0
             FROM generate_series(1, $1) AS i,
             LATERAL (SELECT jsonb_build_object('id', 'bench-' || i, 'type', 'bench.no_handler', 'data', jsonb_build_object('object',
                 jsonb_build_object('id', 'pi_bench_' || i, 'amount_received', 2000, 'currency', 'usd', 'note', '{pad}'))) AS j) AS payload"
        )
    };
    sqlx::query(&sql).bind(n as i64).execute(pool).await.context("seeding pending events")?;
    sqlx::query("ANALYZE webhook_inbox").execute(pool).await?;
    Ok(())
}

/// Retained events `from..to` (`done`, received over the last 60 days, the
/// bench's 1.5 KB payload): what a production inbox holds for deduplication.
pub(super) async fn retain(pool: &PgPool, from: usize, to: usize) -> Result<()> {
    if to <= from {
        return Ok(());
    }
    let pad = "x".repeat(1100);
    let sql = format!(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, headers, secret_index,
                                    received_at, processed_at, attempts)
         SELECT 'stripe', 'retained-' || i, 'payment_intent.succeeded', j, 'done', convert_to(j::text, 'UTF8'), '{{}}', 0,
                now() - (i % 5184000) * interval '1 second', now() - (i % 5184000) * interval '1 second', 1
         FROM generate_series($1::bigint, $2::bigint - 1) AS i,
         LATERAL (SELECT jsonb_build_object('id', 'retained-' || i, 'type', 'payment_intent.succeeded', 'data',
             jsonb_build_object('object', jsonb_build_object('id', 'pi_retained_' || i, 'amount_received', 2000,
                 'currency', 'usd', 'note', '{pad}'))) AS j) AS payload"
    );
    for start in (from..to).step_by(250_000) {
        let end = (start + 250_000).min(to);
        sqlx::query(&sql).bind(start as i64).bind(end as i64).execute(pool).await.context("storing retained events")?;
    }
    sqlx::raw_sql("VACUUM (ANALYZE) webhook_inbox").execute(pool).await?;
    Ok(())
}

/// Removes the retained events.
pub(super) async fn forget_retained(pool: &PgPool) -> Result<()> {
    sqlx::query("DELETE FROM webhook_inbox WHERE event_id LIKE 'retained-%'").execute(pool).await?;
    sqlx::raw_sql("VACUUM (ANALYZE) webhook_inbox").execute(pool).await?;
    Ok(())
}

/// Accounts the deposits of `events` go to: one per ten deposits (a third of the events).
pub(super) fn accounts(events: usize) -> i64 {
    (events as i64 / 30).max(1)
}

/// Removes every row the bench made (they all carry `bench` in their keys).
pub(super) async fn clean(pool: &PgPool) -> Result<()> {
    sqlx::raw_sql(
        "DELETE FROM webhook_inbox WHERE event_id LIKE 'bench-%' OR event_id LIKE 'transactions:bench-%';
         DELETE FROM webhook_bodies b WHERE position('bench-mq-'::bytea IN raw_body) > 0
             AND NOT EXISTS (SELECT 1 FROM webhook_inbox i WHERE i.body_sha256 = b.sha256);
         DELETE FROM transactional_outbox WHERE message_key LIKE '%bench%';
         DELETE FROM payments WHERE payment_id LIKE 'pi_bench_%';
         DELETE FROM orders WHERE order_id LIKE '7000%';
         DELETE FROM account_deposits WHERE token LIKE 'dep_bench_%';
         UPDATE accounts SET balance = 0 WHERE account_id LIKE 'acct_bench_%';",
    )
    .execute(pool)
    .await
    .context("removing the bench's rows")?;
    // Each section starts on tables without the dead rows of the one before
    // (millions after the receive sections), as the peers start on fresh ones.
    sqlx::raw_sql("VACUUM (ANALYZE) webhook_inbox, webhook_bodies, transactional_outbox")
        .execute(pool)
        .await
        .context("vacuuming after the bench's rows")?;
    Ok(())
}
