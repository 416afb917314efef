//! `inbox serve`, the binary as a container runs it: its roles, its health
//! checks and metrics, and its drain on SIGTERM, each on a database of its own.

use std::{
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use inbox_tests::{http_exchange, lines_of, stripe_v1, KillOnDrop};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};

mod traces;

use traces::traced_sink;

const SECRET: &str = "whsec_serve_test";

fn url_of(opts: &PgConnectOptions) -> String {
    format!("postgres://postgres@{}:{}/{}", opts.get_host(), opts.get_port(), opts.get_database().unwrap())
}

/// `inbox serve` on free ports; its stdout's lines, its main and admin addresses.
struct Serve {
    child: KillOnDrop,
    lines: mpsc::Receiver<String>,
    main: String,
    admin: String,
}

fn command(url: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inbox"));
    cmd.arg("serve")
        .args(["--host", "127.0.0.1", "--port", "0", "--admin-port", "0"])
        .args(args)
        .env_clear()
        .envs([
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("RUST_LOG", "warn".into()),
            ("DATABASE_URL", url.into()),
            ("STRIPE_WEBHOOK_SECRET", SECRET.into()),
        ])
        .envs(env.iter().copied());
    cmd
}

impl Serve {
    fn start(url: &str, args: &[&str], env: &[(&str, &str)]) -> Serve {
        let mut child = command(url, args, env).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
        let lines = lines_of(child.stdout.take().unwrap());
        let child = KillOnDrop(child);
        let ready = loop {
            let line = lines.recv_timeout(Duration::from_secs(60)).expect("inbox serve prints ready");
            println!("inbox serve: {line}");
            if line.starts_with("inbox serve ready") {
                break line;
            }
        };
        let addrs: Vec<String> = ready
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("http://"))
            .map(|a| a.trim_end_matches(';').to_string())
            .collect();
        assert_eq!(addrs.len(), 2, "the main and the admin address: {ready}");
        Serve { child, lines, main: addrs[0].clone(), admin: addrs[1].clone() }
    }

    fn sigterm(&self) {
        Command::new("kill").args(["-TERM", &self.child.0.id().to_string()]).status().unwrap();
    }

    /// The line that starts with `prefix`, within `wait`.
    fn line(&self, prefix: &str, wait: Duration) -> String {
        let until = Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no line {prefix:?}"));
            println!("inbox serve: {line}");
            if line.starts_with(prefix) {
                return line;
            }
        }
    }
}

fn get(addr: &str, path: &str) -> (u16, String) {
    let (status, response) =
        http_exchange(addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"));
    (status, response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
}

fn signed_post(addr: &str, id: &str) -> String {
    let body = format!(r#"{{"id":"{id}","type":"customer.created","data":{{"object":{{"id":"cus_1"}}}}}}"#);
    let t = inbox_tests::now();
    let sig = stripe_v1(SECRET, t, body.as_bytes());
    format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nStripe-Signature: t={t},v1={sig}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn post(addr: &str, id: &str) -> (u16, String) {
    let (status, response) = http_exchange(addr, &signed_post(addr, id));
    (status, response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
}

/// The value of one series in a Prometheus text exposition.
fn series(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The test's database with the stock binaries' schema, applied as `inbox serve --migrate` does.
async fn migrated(pool: PgPoolOptions, opts: &PgConnectOptions) -> PgPool {
    let pool = pool.connect_with(opts.clone()).await.unwrap();
    stock::app().migrate(&pool).await.unwrap();
    pool
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < until, "not within 10 s: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn serve_is_ready_once_migrated_then_takes_deliveries_and_counts_them(
    pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool: PgPool = pool.connect_with(opts.clone()).await.unwrap();
    let serve = Serve::start(&url_of(&opts), &[], &[("INBOX_POLL_MS", "20")]);
    // Alive at once; not ready, saying why, until every migration is there (the stages wait for them).
    for addr in [&serve.main, &serve.admin] {
        assert_eq!(get(addr, "/healthz"), (200, r#"{"status":"alive"}"#.into()));
    }
    let (status, why) = get(&serve.admin, "/readyz");
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("migrations not applied") && why.contains("webhook inbox"), "{why}");
    // The port that faces the internet says only that: the reason is the admin port's and the log's.
    assert_eq!(get(&serve.main, "/readyz"), (503, r#"{"status":"not ready"}"#.into()));
    serve.line("waiting for migrations before the stages start", Duration::from_secs(5));
    // One command migrates what `inbox serve` runs: the inbox alone, without `--stock`.
    let migrate = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .arg("migrate")
        .env_clear()
        .envs([("PATH", std::env::var("PATH").unwrap_or_default()), ("DATABASE_URL", url_of(&opts))])
        .output()
        .unwrap();
    assert!(migrate.status.success(), "{}", String::from_utf8_lossy(&migrate.stderr));
    eventually("ready", || get(&serve.main, "/readyz") == (200, r#"{"status":"ready"}"#.into())).await;

    assert_eq!(post(&serve.main, "evt_s_1"), (200, r#"{"status":"accepted"}"#.into()));
    assert_eq!(post(&serve.main, "evt_s_1"), (200, r#"{"status":"duplicate"}"#.into()));
    assert_eq!(post(&serve.main, "evt_s_2"), (200, r#"{"status":"accepted"}"#.into()));
    let forged = signed_post(&serve.main, "evt_s_3").replace("v1=", "v1=00");
    assert_eq!(http_exchange(&serve.main, &forged).0, 401);
    // The worker takes them (no handler takes customer.created: unhandled).
    let unhandled = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM webhook_inbox WHERE status = 'unhandled'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let until = Instant::now() + Duration::from_secs(10);
    while unhandled().await < 2 {
        assert!(Instant::now() < until, "the worker did not take the events");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let metrics = || get(&serve.admin, "/metrics").1;
    let stripe = |name: &str| format!("webhook_inbox_{name}_total{{function=\"receive\",provider=\"stripe\"}}");
    eventually("the worker's counts", || {
        series(&metrics(), "webhook_inbox_unhandled_total{function=\"process\"}") == Some(2.0)
    })
    .await;
    let m = metrics();
    assert_eq!(series(&m, &stripe("received")), Some(2.0), "{m}");
    assert_eq!(series(&m, &stripe("duplicate")), Some(1.0), "{m}");
    assert_eq!(series(&m, &stripe("rejected_signature")), Some(1.0), "{m}");
    assert_eq!(series(&m, "webhook_inbox_receive_duration_seconds_count"), Some(4.0), "{m}");
    assert!(m.contains("webhook_inbox_receive_group_size_bucket"), "{m}");
    // The queue's gauges (taken every 15 s, the first as the stages start).
    eventually("the queue's gauges", || series(&metrics(), "webhook_inbox_pending{function=\"process\"}").is_some())
        .await;
    // Not on the port that faces the internet.
    assert_eq!(get(&serve.main, "/metrics").0, 404);

    serve.sigterm();
    serve.line("drained in", Duration::from_secs(10));
}

#[sqlx::test(migrations = false)]
async fn roles_choose_what_an_instance_does_and_a_role_that_cannot_run_is_refused(
    pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = migrated(pool, &opts).await;
    let url = url_of(&opts);
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index)
         VALUES ('stripe', 'evt_queued', 'customer.created', '{}', '{}', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    // A receive-only instance takes deliveries and processes nothing.
    let receive = Serve::start(&url, &["--roles", "receive"], &[]);
    assert_eq!(post(&receive.main, "evt_r_1").0, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'pending'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pending, 2, "a receive-only instance runs no worker");
    receive.sigterm();
    receive.line("drained in", Duration::from_secs(10));

    // A worker-only instance (named by INBOX_ROLES) has no webhook route, and drains the queue.
    let process = Serve::start(&url, &[], &[("INBOX_ROLES", "process"), ("INBOX_POLL_MS", "20")]);
    let (status, answer) = post(&process.main, "evt_r_2");
    assert_eq!(status, 404, "{answer}");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE status = 'pending'")
            .fetch_one(&pool)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < until, "the process role did not drain the queue");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    process.sigterm();
    process.line("drained in", Duration::from_secs(10));

    // What cannot run says so, and starts nothing.
    for (args, env, says) in [
        (vec!["--roles", "receive,bogus"], vec![], "\"bogus\" is not a role"),
        (vec!["--roles", "relay"], vec![], "the relay role has no destination"),
        (
            vec!["--roles", "relay"],
            vec![("RELAY_DESTINATIONS", "[destination.mail]\nurl = \"http://127.0.0.1:1\"\nconcurency = 4")],
            "unknown field `concurency`",
        ),
        (vec!["--roles", "reconcile"], vec![], "the reconcile role has nothing to reconcile"),
        (vec![], vec![("STRIPE_WEBHOOK_SECRET", "")], "no webhook secret is set"),
        (vec![], vec![("DATABASE_URL", "")], "DATABASE_URL is not set"),
    ] {
        let out = command(&url, &args, &env).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{args:?} {env:?}: {stderr}");
    }
}

/// On SIGTERM: not ready, no new connection, and the delivery in flight (its
/// claim waiting on a row lock the test holds) answered only once its claim
/// has committed; then the process exits 0.
#[sqlx::test(migrations = false)]
async fn sigterm_answers_the_delivery_in_flight_after_its_commit_then_exits(
    pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = migrated(pool, &opts).await;
    let mut serve = Serve::start(
        &url_of(&opts),
        &[],
        &[("INBOX_LOCK_TIMEOUT_MS", "20000"), ("INBOX_STATEMENT_TIMEOUT_MS", "30000")],
    );
    let mut holder = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index)
         VALUES ('stripe', 'evt_held', 'x', '{}', 'x', 0)",
    )
    .execute(&mut *holder)
    .await
    .unwrap();
    let main = serve.main.clone();
    let in_flight = std::thread::spawn(move || {
        let started = Instant::now();
        (post(&main, "evt_held"), started.elapsed())
    });
    // The claim is waiting on the lock.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted").fetch_one(&pool).await.unwrap();
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < until, "the claim never waited on the lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    serve.sigterm();
    serve.line("draining", Duration::from_secs(5));
    let (status, why) = get(&serve.admin, "/readyz");
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("draining"), "{why}");
    assert!(std::net::TcpStream::connect(&serve.main).is_err(), "no new connection while draining");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!in_flight.is_finished(), "answered before its claim could commit");
    holder.rollback().await.unwrap();
    let ((status, answer), took) = in_flight.join().unwrap();
    assert_eq!((status, answer.as_str()), (200, r#"{"status":"accepted"}"#), "after {took:?}");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_inbox WHERE event_id = 'evt_held'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 1);
    let drained = serve.line("drained in", Duration::from_secs(10));
    assert!(drained.contains("0 deliveries answered 503"), "{drained}");
    assert!(serve.child.0.wait().unwrap().success());
}

/// Past INBOX_DRAIN_TIMEOUT_MS, the delivery still waiting is answered 503
/// (its provider sends it again), and the process exits.
#[sqlx::test(migrations = false)]
async fn past_the_drain_timeout_the_delivery_in_flight_is_answered_503(pool: PgPoolOptions, opts: PgConnectOptions) {
    let pool = migrated(pool, &opts).await;
    let env = [
        ("INBOX_LOCK_TIMEOUT_MS", "20000"),
        ("INBOX_STATEMENT_TIMEOUT_MS", "30000"),
        ("INBOX_DRAIN_TIMEOUT_MS", "300"),
    ];
    let mut serve = Serve::start(&url_of(&opts), &[], &env);
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE webhook_inbox IN EXCLUSIVE MODE").execute(&mut *holder).await.unwrap();
    let main = serve.main.clone();
    let in_flight = std::thread::spawn(move || post(&main, "evt_late"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    serve.sigterm();
    let (status, answer) = in_flight.join().unwrap();
    assert_eq!(status, 503, "{answer}");
    assert!(answer.contains("shutting down"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let drained = serve.line("drained in", Duration::from_secs(10));
    assert!(drained.contains("1 deliveries answered 503"), "{drained}");
    assert!(serve.child.0.wait().unwrap().success());
    holder.rollback().await.unwrap();
}

/// Each destination's counts and state are series of their own, labelled
/// with its name: one flowing, one paused by an operator (its message
/// waiting), beside the totals (a message for a destination no relay has
/// counted as unrouted).
#[sqlx::test(migrations = false)]
async fn each_destination_has_its_own_series_in_the_metrics(pool: PgPoolOptions, opts: PgConnectOptions) {
    let pool = migrated(pool, &opts).await;
    for (key, destination) in [("m-1", "default"), ("m-2", "default"), ("m-3", "mail"), ("m-4", "nowhere")] {
        sqlx::query(
            "INSERT INTO transactional_outbox (aggregate_type, aggregate_id, payload, message_key, destination)
             VALUES ('thing', $1, '{}', $1, $2)",
        )
        .bind(key)
        .bind(destination)
        .execute(&pool)
        .await
        .unwrap();
    }
    let by = webhook_inbox::ops::Audit { actor: "alice", action: "pause_destination", reason: "mail is down" };
    assert!(webhook_inbox::ops::pause_destination(&pool, "mail", &by).await.unwrap());
    let (sink, sunk) = traced_sink();
    let env = [
        ("RELAY_HTTP_URL", sink.as_str()),
        ("RELAY_DESTINATIONS", "[destination.mail]\nurl = \"http://127.0.0.1:1\""),
        ("INBOX_POLL_MS", "20"),
    ];
    let serve = Serve::start(&url_of(&opts), &[], &env);
    for _ in 0..2 {
        sunk.recv_timeout(Duration::from_secs(10)).expect("default's messages reach its sink");
    }
    let metrics = || get(&serve.admin, "/metrics").1;
    let relay = |name: &str, destination: &str| {
        format!("webhook_inbox_{name}{{function=\"relay\",destination=\"{destination}\"}}")
    };
    eventually("default's count", || series(&metrics(), &relay("relayed_total", "default")) == Some(2.0)).await;
    eventually("mail's state", || series(&metrics(), &relay("relay_destination_paused", "mail")) == Some(1.0)).await;
    let m = metrics();
    assert_eq!(series(&m, &relay("relay_destination_backlog", "mail")), Some(1.0), "{m}");
    assert_eq!(series(&m, &relay("relay_destination_open", "mail")), Some(0.0), "{m}");
    assert_eq!(series(&m, &relay("relay_destination_paused", "default")), Some(0.0), "{m}");
    assert_eq!(series(&m, "webhook_inbox_relay_paused{function=\"relay\"}"), Some(1.0), "{m}");
    assert_eq!(series(&m, "webhook_inbox_relay_unrouted{function=\"relay\"}"), Some(1.0), "no relay has nowhere: {m}");
    assert_eq!(series(&m, &relay("relayed_total", "mail")), Some(0.0), "mail sent nothing: {m}");
}

#[sqlx::test(migrations = false)]
async fn the_admin_interface_binds_where_inbox_admin_host_says(_: PgPoolOptions, opts: PgConnectOptions) {
    let serve = Serve::start(&url_of(&opts), &[], &[("INBOX_ADMIN_HOST", "127.0.0.2")]);
    assert!(serve.main.starts_with("127.0.0.1:"), "{}", serve.main);
    assert!(serve.admin.starts_with("127.0.0.2:"), "{}", serve.admin);
    assert_eq!(get(&serve.admin, "/healthz").0, 200);
    let port = serve.admin.split(':').nth(1).unwrap();
    assert!(std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err(), "not on the main host");
}

#[sqlx::test(migrations = false)]
async fn webhooks_and_healthz_are_answered_within_a_second_while_1024_slow_console_clients_hold_on(
    pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let _pool = migrated(pool, &opts).await;
    let serve = Serve::start(&url_of(&opts), &["--roles", "receive,console"], &[]);
    eventually("ready", || get(&serve.main, "/readyz").0 == 200).await;
    let slow = inbox_tests::slow_clients(&serve.main, "/console/signin", 1024);
    // Each taken in by the server (or answered at once) before the webhooks are tried.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..5 {
        let healthz = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", serve.main);
        assert_eq!(
            inbox_tests::answered_within(&serve.main, &healthz, Duration::from_secs(1)),
            Some(200),
            "/healthz, {i}"
        );
        let delivery = signed_post(&serve.main, &format!("evt_slow_{i}"));
        assert_eq!(
            inbox_tests::answered_within(&serve.main, &delivery, Duration::from_secs(1)),
            Some(200),
            "a delivery, {i}"
        );
    }
    let page = format!("GET /console/signin HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", serve.main);
    let console = inbox_tests::answered_within(&serve.main, &page, Duration::from_secs(1));
    assert!(matches!(console, Some(200 | 503)), "the console answers at once, if only that it is busy: {console:?}");
    drop(slow);
}
