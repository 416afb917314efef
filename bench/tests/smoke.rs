//! `inbox-bench --smoke` as CI runs it: every comparison, both sides, and the
//! report with every figure and ratio. It runs the `inbox` binary and the
//! functions' binaries built beside it (`cargo build --workspace` first; the
//! test command does).

use std::process::Command;

/// The benchmarks at their smoke size (CI): every comparison runs, on both
/// sides, and the report has every figure and ratio. No figure is judged.
#[test]
fn the_smoke_size_runs_every_comparison_and_writes_the_report() {
    let report = std::env::temp_dir().join(format!("inbox-bench-smoke-{}.md", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_inbox-bench"))
        .args(["--smoke", "--verbose", "--out"])
        .arg(&report)
        // Its own embedded cluster; the rest of the environment stays (npm needs HOME and the machine's CA settings).
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let round = stdout.lines().find(|l| l.starts_with("receive 2 in flight, all new, round 1:")).expect("a round line");
    let rates: Vec<f64> = round
        .split('|')
        .filter_map(|part| part.split_whitespace().find_map(|w| w.strip_suffix("/s")?.parse().ok()))
        .collect();
    assert_eq!(rates.len(), 2, "{round}");
    assert!(rates.iter().all(|r| *r > 0.0), "{round}");
    let doc = std::fs::read_to_string(&report).unwrap();
    let _ = std::fs::remove_file(&report);
    for part in [
        "## Receive, 2 in flight, all new",
        "## Receive, 2 in flight, 50% duplicates",
        "graphile-worker 0.17.3, 2000 no-op jobs",
        "| process, 2000 events, stock handlers",
        "| process (no handler, 2000 retained) / graphile-worker (no-op jobs), 2 a side |",
        "| process, 2000 events, no handler, 2 workers, empty inbox |",
        "| process (no handler), 20000 retained / empty inbox |",
        "| process with a snapshot held open / without |",
        "| process, 2000 events, no handler, 2 workers, 2000 retained, a snapshot held open |",
        "| relay with a snapshot held open / without |",
        "| lz4 / pglz, the INSERT's time per event of about 2 KB |",
        "| lz4, WAL per event (1000 events of about 2 KB) |",
        "| relay, 2000 messages, a sink in its own process, a snapshot held open |",
        "| receive's own CPU per delivery, 2 in flight, all new |",
        "| receive's own CPU per delivery (µs), 2 in flight, all new |",
        "| receive p99 (ms), 2 in flight, all new |",
        "group commit (up to 64 deliveries a group",
        "## Receive, Marqeta batches",
        "| prune, 20000 old rows, while receive runs |",
        "| receive p99, 2 in flight, prune running |",
        "| wrk to the sink answering at once, 64 connections, the same body |",
        "| relay to a sink in its own process (no network), concurrency 64 |",
        "| pgbench, the relay's lease (100) and record statements, 2 clients |",
        "| relay to a sink answering in 50 ms, concurrency 256 |",
        "| received → delivered p99, 100 events/s through serve |",
        "| received → delivered p99, 100 events/s through the functions |",
        "| received → delivered p50, 100 events/s through serve (ms) |",
        "| beside a 5 s destination / alone |",
        "| verify + events, declared Stripe, one thread |",
        "| declared / coded, verify + events in process |",
        "| receive: warm invocation p99, all new |",
        "| receive: database round trips per delivery, all new | 1.00 |",
        "| relay: exec to first poll (ms) |",
        "| receive's WAL per event / pgbench's identical row |",
        "| claim p50 with 20000 events / empty inbox |",
    ] {
        assert!(doc.contains(part), "{part} missing from the report:\n{doc}");
    }
}
