//! `inbox dev` as a new user runs it: no DATABASE_URL, no secrets. It must start
//! its own PostgreSQL, say `ready` with the URL, take a signed delivery over
//! real HTTP, and leave nothing behind when stopped.

use inbox_tests::{dev_ready, inbox_dev, KillOnDrop};
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

/// One HTTP/1.1 exchange; returns the status code and the body.
fn http(addr: &str, request: &str) -> (u16, String) {
    let (status, response) = inbox_tests::http_exchange(addr, request);
    (status, response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
}

fn signed_stripe_post(addr: &str, body: &str) -> String {
    let t = inbox_tests::now();
    let sig = inbox_tests::stripe_v1("whsec_dev_stripe_secret", t, body.as_bytes());
    format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nStripe-Signature: t={t},v1={sig}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A local HTTP sink: answers 200 to every request and hands over its Idempotency-Key.
fn sink() -> (String, mpsc::Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/outbox", listener.local_addr().unwrap());
    let (keys, received) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let keys = keys.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                loop {
                    let (mut length, mut key) = (0usize, None);
                    let mut line = String::new();
                    while reader.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                        let l = line.trim_end().to_ascii_lowercase();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if let Some(v) = l.strip_prefix("idempotency-key:") {
                            key = Some(v.trim().to_string());
                        }
                        line.clear();
                    }
                    let Some(key) = key else { return };
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = keys.send(key);
                    if stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, received)
}

#[test]
fn inbox_dev_runs_on_an_embedded_postgres_and_takes_signed_deliveries() {
    let (sink_url, sink_keys) = sink();
    // As a new user: no DATABASE_URL, no secrets, nothing inherited; a local sink for the relay.
    let (mut child, lines) = inbox_dev(env!("CARGO_BIN_EXE_inbox"), &[("RELAY_HTTP_URL", &sink_url)]);
    let mut data_dir = None;
    let mut database_url = None;
    let addr = dev_ready(&lines, |line| {
        if let Some(rest) = line.strip_prefix("embedded PostgreSQL at ") {
            database_url = rest.split_whitespace().next().map(str::to_string);
        }
        if let Some(rest) = line.split("(data in ").nth(1) {
            data_dir = rest.split(';').next().map(str::to_string);
        }
    });
    let data_dir = data_dir.expect("the embedded cluster's folder is printed");

    let body = r#"{"id":"evt_dev_1","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","amount_received":2000,"currency":"usd"}}}"#;
    assert_eq!(http(&addr, &signed_stripe_post(&addr, body)), (200, r#"{"status":"accepted"}"#.into()));
    assert_eq!(http(&addr, &signed_stripe_post(&addr, body)), (200, r#"{"status":"duplicate"}"#.into()));
    // The worker turns it into a payment and an outbox message (polling every INBOX_POLL_MS, 200 ms).
    let url = database_url.expect("the embedded cluster's URL is printed");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let started = std::time::Instant::now();
    let effects = runtime.block_on(async {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        loop {
            let counts: (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM payments WHERE payment_id = 'pi_1'), (SELECT count(*) FROM transactional_outbox)",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if counts == (1, 1) || started.elapsed() > Duration::from_secs(5) {
                pool.close().await;
                return counts;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    assert_eq!(effects, (1, 1), "no payment and outbox message after 5 s");
    println!("payment and outbox message visible {:?} after the 200", started.elapsed());
    let key =
        sink_keys.recv_timeout(Duration::from_secs(5)).expect("the relay delivers the outbox message to the sink");
    assert_eq!(key, "payment_succeeded:pi_1");
    println!("outbox message at the sink {:?} after the 200", started.elapsed());

    // A type no stock handler takes ends `unhandled`, not done: nothing ran for it, and
    // one requeue by type would run a handler deployed later over it.
    let unhandled = r#"{"id":"evt_dev_2","type":"customer.created","data":{"object":{"id":"cus_1"}}}"#;
    assert_eq!(http(&addr, &signed_stripe_post(&addr, unhandled)).0, 200);
    let status = runtime.block_on(async {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        for _ in 0..250 {
            let status: String = sqlx::query_scalar("SELECT status FROM webhook_inbox WHERE event_id = 'evt_dev_2'")
                .fetch_one(&pool)
                .await
                .unwrap();
            if status != "pending" {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        "still pending after 5 s".into()
    });
    assert_eq!(status, "unhandled");
    let inbox = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_inbox")).args(args).env("DATABASE_URL", &url).output().unwrap();
        assert!(out.status.success(), "inbox {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let shown = inbox(&["show", "stripe", "evt_dev_2"]);
    assert!(shown.contains("customer.created), unhandled"), "{shown}");
    let dry = inbox(&["requeue", "--status", "unhandled", "--type", "customer.created", "--dry-run", "--json"]);
    let dry: serde_json::Value = serde_json::from_str(&dry).unwrap();
    assert_eq!(dry["matching"], 1, "{dry}");

    let forged = signed_stripe_post(&addr, body).replace("v1=", "v1=00");
    assert_eq!(http(&addr, &forged).0, 401);
    // Refused from the Content-Length alone: the body is never sent.
    let (status, answer) = http(
        &addr,
        &format!(
            "POST /webhooks/stripe HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 2000000\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(status, 413, "{answer}");

    Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().unwrap();
    let status = child.0.wait().unwrap();
    assert!(status.success(), "inbox dev exits cleanly: {status}");
    assert!(!std::path::Path::new(&data_dir).exists(), "the embedded cluster is removed on exit");
}

/// Out of descriptors (`ulimit -n 64`, more connections than that): `inbox
/// dev` backs off between failed accepts instead of spinning on them, and
/// serves again once the connections close.
#[test]
fn out_of_descriptors_it_backs_off_and_recovers() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let base = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = format!("dev_descriptors_{}", std::process::id());
    let admin = runtime.block_on(sqlx::PgPool::connect(&base)).unwrap();
    runtime.block_on(sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin)).unwrap();
    let url = format!("{}/{name}", base.rsplit_once('/').unwrap().0);

    let script = format!("ulimit -n 64 && exec {} dev --port 0", env!("CARGO_BIN_EXE_inbox"));
    let child = Command::new("sh")
        .args(["-c", &script])
        .env_clear()
        .envs([("PATH", std::env::var("PATH").unwrap_or_default()), ("RUST_LOG", "warn".into())])
        .env("DATABASE_URL", &url)
        .env("INBOX_DB_POOL_SIZE", "4")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let (warnings_tx, warnings) = mpsc::channel();
    let stderr = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = warnings_tx.send(line);
        }
    });
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines().map_while(Result::ok);
    let ready = lines.find(|l| l.contains("ready"));
    // Read to the end, so that its last lines (on SIGTERM) find a reader.
    std::thread::spawn(move || lines.for_each(drop));
    let addr = ready
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with("http://")).map(str::to_string))
        .expect("inbox dev says ready")
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();

    let held: Vec<TcpStream> = (0..100).filter_map(|_| TcpStream::connect(&addr).ok()).collect();
    std::thread::sleep(Duration::from_secs(3));
    let failed: Vec<String> = warnings.try_iter().filter(|l| l.contains("accept failed")).collect();
    assert!(!failed.is_empty(), "the descriptors ran out: the test tests nothing otherwise");
    assert!(failed.len() <= 20, "{} accept failures logged in 3 s: it spins", failed.len());
    drop(held);
    std::thread::sleep(Duration::from_millis(1500));
    let body = r#"{"id":"evt_after_emfile","type":"payment_intent.succeeded","data":{"object":{"id":"pi_e"}}}"#;
    assert_eq!(http(&addr, &signed_stripe_post(&addr, body)).0, 200, "it serves again");

    drop(child);
    runtime.block_on(sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)")).execute(&admin)).unwrap();
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 300 slow 1 MiB bodies at once: `inbox dev` reads at most 64 MiB of bodies
/// at a time (the rest wait their turn), and gives the memory back after.
#[test]
fn three_hundred_slow_large_bodies_are_read_in_turn_and_the_memory_given_back() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let base = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = format!("dev_bodies_{}", std::process::id());
    let admin = runtime.block_on(sqlx::PgPool::connect(&base)).unwrap();
    runtime.block_on(sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin)).unwrap();
    let url = format!("{}/{name}", base.rsplit_once('/').unwrap().0);
    // Each refused delivery would log a line: errors only.
    let (child, lines) = inbox_dev(env!("CARGO_BIN_EXE_inbox"), &[("RUST_LOG", "error"), ("DATABASE_URL", &url)]);
    let pid = child.0.id();
    let addr = dev_ready(&lines, |_| {});
    let before = rss_kib(pid);
    let body = vec![b'x'; 1024 * 1024];
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watcher = {
        let peak = peak.clone();
        std::thread::spawn(move || {
            for _ in 0..200 {
                peak.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(25));
            }
        })
    };
    let senders: Vec<_> = (0..300)
        .map(|_| {
            let (addr, body) = (addr.clone(), body.clone());
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let head = format!(
                    "POST /webhooks/stripe HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                s.write_all(head.as_bytes()).unwrap();
                for chunk in body.chunks(256 * 1024) {
                    if s.write_all(chunk).is_err() {
                        return 0;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer);
                answer.split(' ').nth(1).and_then(|c| c.parse::<u16>().ok()).unwrap_or(0)
            })
        })
        .collect();
    let statuses: Vec<u16> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    watcher.join().unwrap();
    // Given back once the connections close: polled, since a loaded machine
    // (a cold CI run) takes longer than an idle one to get there.
    let settled = std::time::Instant::now() + Duration::from_secs(15);
    let mut after = rss_kib(pid);
    while after >= before + 32 * 1024 && std::time::Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(250));
        after = rss_kib(pid);
    }
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    println!("RSS: {before} KiB before, {peak} KiB at the peak, {after} KiB after");
    assert!(statuses.iter().all(|s| *s == 401), "unsigned, each refused once read: {statuses:?}");
    assert!(
        peak < before + 150 * 1024,
        "at most 64 MiB of bodies at once: {peak} KiB at the peak, {before} KiB before"
    );
    assert!(after < before + 32 * 1024, "the memory given back: {after} KiB after, {before} KiB before");
    drop(child);
    runtime.block_on(sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)")).execute(&admin)).unwrap();
}
