//! The report: the versions, the markdown written to `--out`.

use super::*;

pub(super) async fn versions(pool: &PgPool) -> Result<(String, String)> {
    let pg: String =
        sqlx::query_scalar("SELECT 'PostgreSQL ' || current_setting('server_version')").fetch_one(pool).await?;
    let pgbench = dev::postgres_bin_dir()?.join("pgbench");
    let out = tokio::process::Command::new(&pgbench).arg("--version").output().await?;
    Ok((pg, String::from_utf8_lossy(&out.stdout).trim().to_string()))
}

impl Report {
    pub(super) fn markdown(&self, bench: &Bench, cores: usize, pg: &str, pgbench: &str) -> String {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("model name")?.split(':').nth(1).map(|m| m.trim().to_string()))
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let c = bench.in_flight();
        let (e2e, rate) = (latency::RATE * bench.seconds, latency::RATE);
        let mut doc = String::from("# Benchmarks\n\n");
        let _ = writeln!(
            doc,
            "Written by `inbox-bench --out docs/benchmarks.md` ({} build): {} rounds, the two sides of \
             each comparison alternated in every round; each figure is the median of the rounds, with the \
             lowest and highest. Where a target is missed, [performance.md](performance.md) explains the \
             gap with a profile and names the next lever.\n\n\
             - Machine: {cores} cores ({cpu}), load generator, server and PostgreSQL sharing them.\n\
             - PostgreSQL: {pg}; {pgbench}.\n\
             - The inbox holds {} `done` events received over 60 days (its retention window) in every section \
             after the first process figure, as a production inbox does.\n\
             - Receive: {} s per side and round; bodies of about 1.5 KB (Stripe events, signed); `inbox serve`'s \
             path: its HTTP server, group commit ({}), every delivery counted in its Prometheus metrics; \
             `synchronous_commit` on. pgbench runs the claim's single-row INSERT (prepared) with the same body, \
             the same concurrency, and each delivery twice for the duplicate runs.\n\
             - Process: {} pending events per round drained by {} workers (batches of {}, no savepoint per event \
             until a handler fails), with no handler (events no handler takes: unhandled, without effect) and \
             with the stock handlers (a third each of Stripe payments, Shopify order snapshots and Marqeta \
             deposits to one account per ten deposits, each with its effect and its outbox message); against \
             graphile-worker {GRAPHILE_WORKER} (npm) draining as many no-op jobs carrying the same payload, as many \
             processes as we have workers, each of 24 concurrent jobs, `localQueue` 500, \
             `completeJobBatchDelay` 0, no log line per job, in a database of its own: its jobs seeded, \
             vacuumed and checkpointed, its processes started with their pools connected, then timed from the \
             word to start to the exit of the last (`runOnce`), nothing reading its tables meanwhile (each of \
             our drains starts checkpointed too). `bench/graphile-alone.sh` runs it alone by its own CLI, the \
             check on this figure. The worker with no handler \
             is measured on an empty inbox first; last, it alternates between two freshly migrated schemas, \
             one empty and one holding {} retained events (vacuumed and checkpointed before the first drain, \
             as an old window is settled on disk).\n\
             - A snapshot held open: the worker with no handler drains {} pending events on the inbox holding \
             the retained ones, with a repeatable-read transaction opened after they were written and held \
             until the drain ends (vacuum then removes none of the finished events' row versions or index \
             entries), alternated with the same drain without it; the table vacuumed before each. Then the \
             relay the same way: as many outbox messages of about 1.5 KB to a sink in its own process \
             (concurrency 64), with and without a snapshot held open.\n\
             - Marqeta batches: {c} in flight for {} s, ten new deposits per batch (Basic auth), all items \
             claimed in one statement, the body stored once.\n\
             - Prune: {} `done` rows older than any retention seeded per round; receive at {c} in flight for \
             {} s alone, then again while the prune deletes them (batches of `INBOX_PRUNE_BATCH`, each its own \
             transaction); rows/s over the time the prune ran. The prune may end before the receive window does \
             (see its rows/s): receive's p99 with prune is over the whole window.\n\
             - Relay: outbox messages of about 1.5 KB to a local HTTP sink in the same process (the HTTP sink \
             of `relay`, batches of `RELAY_BATCH_SIZE`), {} s per round at most: answering at once, the relay at \
             concurrency 64 beside `wrk` (2 threads, 64 connections, the same body and headers) driving the same \
             sink, and to a sink in the relay's own process taking every message at once, beside pgbench running \
             the relay's own lease (100 messages, their payloads fetched) and record statements at 2 clients \
             (what the relay's database work allows); answering in 50 ms, concurrency 256, against 256 / 50 ms; a destination \
             answering at once alone, then in the same relay beside one answering in 5 s (its rate over the time \
             its sink took to receive all its messages).\n\
             - Received → delivered: {e2e} signed Stripe `payment_intent.succeeded` events a round at a steady {rate} a \
             second, each one's time from just before its delivery is sent to the outbox message the stock \
             payments handler writes for it reaching a local HTTP sink. Through `inbox serve` (its own process, \
             configured by its environment only, every role but the console); then through the `receive`, \
             `process` and `relay` binaries, one instance each, under the stand-in Runtime API, the bench playing \
             the two queues' event sources: each accepted event a record for `process` (batches of up to 10, \
             the next as soon as `process` answered), each `process` invocation a nudge for `relay`; what a real \
             queue and its poller add between two functions is not included.\n\
             - Verification: a signed Stripe delivery's signature check and event parsing, in process on \
             one thread, {} s per side and round: the coded scheme, and the same contract declared as data.\n\
             - Lambda: each function binary exec'd with a Lambda environment against a stand-in Runtime \
             API on loopback, timed from the spawn to its first poll; the size of the arm64 `bootstrap` artifact \
             `scripts/build-lambdas` builds (of the native binary if there is none; 10^6 bytes to the MB); `receive` \
             then given signed API Gateway events one at a time (warm latency from the event handed over to \
             the answer, peak RSS), and, in a second instance behind a counting TCP proxy, database round trips \
             per delivery (the client speaking again after the server answered).\n\
             - Growth: {} deliveries at {c} in flight on each side, each side in a freshly migrated schema of \
             its own; WAL is the LSN's advance, stored bytes the growth of every table, TOAST table and index \
             of the schema, both per row stored. TOAST compression: events shaped as Stripe's \
             `payment_intent.succeeded` (about 2 KB, ids, amounts and addresses varying) written by one INSERT \
             on one connection into a freshly migrated inbox whose payload and raw bytes are compressed with \
             pglz, then with lz4 (where the server has it): the INSERT's time, WAL and bytes per event. Claim latency: new 1.5 KB events claimed one at a time on one \
             connection, on an empty inbox and on one holding {} events (small payloads: the claim's cost is in \
             the indexes).\n\
             - Listing: the console's `ops::list_events` on {} events over 60 days in a freshly migrated schema \
             (five providers, eight types and one of 0.01%, 0.1% failed, 0.1% unhandled, 1,000 pending), on the \
             console's pool settings; each filter run 12 times a round, the figure the median of the last 7 (the \
             first warm the cache, as a console in use has it); a page of 50.\n",
            if cfg!(debug_assertions) { "debug" } else { "release" },
            bench.rounds,
            bench.retained,
            bench.seconds,
            group_commit(),
            bench.events,
            bench.workers,
            WorkerConfig::default().batch_size,
            bench.growth_rows.max(bench.retained),
            bench.events,
            bench.seconds,
            bench.events * 10,
            bench.seconds,
            bench.seconds,
            bench.seconds,
            (bench.events / 2).max(c),
            bench.growth_rows,
            bench.growth_rows,
        );
        for (title, figures) in &self.sections {
            let _ = writeln!(
                doc,
                "## {title}\n\n| figure | median | lowest | highest | unit |\n| --- | --- | --- | --- | --- |"
            );
            for f in figures {
                let (lo, hi) = f.spread();
                let _ = writeln!(doc, "| {} | {} | {} | {} | {} |", f.name, fmt(f.median()), fmt(lo), fmt(hi), f.unit);
            }
            doc.push('\n');
        }
        let _ = writeln!(
            doc,
            "## Targets\n\n| check | median | per round | target | met |\n| --- | --- | --- | --- | --- |"
        );
        for c in &self.checks {
            let rounds: Vec<String> = c.values.iter().map(|&v| fmt(v)).collect();
            let met = if c.met() { "yes" } else { "no" };
            let bound = if c.at_most { "<=" } else { ">=" };
            let _ = writeln!(
                doc,
                "| {} | {} | {} | {bound} {} | {met} |",
                c.name,
                fmt(c.median()),
                rounds.join(", "),
                fmt(c.target)
            );
        }
        doc
    }
}

/// Group commit as the bench's receive runs it (the environment's `INBOX_GROUP_COMMIT_*`).
pub(super) fn group_commit() -> String {
    match webhook_inbox_service::serve::ServeConfig::read(&webhook_inbox::config::Env::process()) {
        Ok(c) if c.group.is_on() => format!(
            "up to {} deliveries a group, a wait of {} µs, the next group beside one committing {} µs, up to {} at once",
            c.group.max,
            c.group.wait.as_micros(),
            c.group.stall.as_micros(),
            c.group.committers
        ),
        Ok(_) => "off: one claim per delivery".into(),
        Err(e) => format!("unreadable: {e}"),
    }
}

pub(super) fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}
