//! The console in a real browser: `inbox dev` on a database of its own, a
//! failed event and a hostile one delivered over HTTP, a viewer added with
//! `inbox console user add`, then `tests/console/console.mjs` drives Debian's
//! Chromium through playwright-core (sign in, filter, open, replay, a viewer,
//! CSRF, a hostile payload, the live listing) and writes the screenshots the
//! docs show (`docs/console-*.png`), so that they cannot go stale. The
//! database is checked afterwards.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use inbox_tests::{dev_ready, http_exchange, inbox_dev, lines_of, KillOnDrop};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};

/// One HTTP/1.1 POST; the status code.
fn post(addr: &str, path: &str, headers: &[(&str, &str)], body: &str) -> u16 {
    let mut request = format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()));
    http_exchange(addr, &request).0
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

async fn status(pool: &PgPool, provider: &str, id: &str) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM webhook_inbox WHERE provider = $1 AND event_id = $2")
        .bind(provider)
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_console_in_a_browser_signs_in_filters_opens_and_replays_and_keeps_viewers_and_payloads_harmless(
    pool_options: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let node_modules = repo().join("tests/console/node_modules/playwright-core");
    assert!(node_modules.exists(), "playwright-core is missing: run `npm ci` in tests/console (scripts/test does)");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(Path::new(&chromium).exists(), "{chromium} is missing: apt-get install chromium (scripts/test does)");

    let url = url_of(&opts);
    let pool = pool_options.connect_with(opts).await.unwrap();
    // One attempt: the deposit for an account that does not exist fails at once, and opens an alert.
    // GitHub's pings are ignored.
    let rules =
        "[[alert]]\nname = \"deposits failing\"\ncondition = \"failed\"\nprovider = \"marqeta\"\nthreshold = 1\n\
                 [[ignore]]\nname = \"pings\"\nprovider = \"github\"\ntype = \"ping\"";
    // The stock application on a database of its own: its payments, and its deposits failing.
    let env =
        [("DATABASE_URL", url.as_str()), ("INBOX_STOCK", "1"), ("INBOX_MAX_ATTEMPTS", "1"), ("INBOX_RULES", rules)];
    let (_child, lines) = inbox_dev(env!("CARGO_BIN_EXE_inbox"), &env);
    let (mut console, mut operator, mut password) = (None, None, None);
    let addr = dev_ready(&lines, |line| {
        if let Some(rest) = line.strip_prefix("console: ") {
            console = rest.split_whitespace().next().map(|u| u.trim_end_matches('/').to_string());
            operator = rest.split("sign in as ").nth(1).and_then(|p| p.split(',').next()).map(str::to_string);
            password = rest.split("password ").nth(1).and_then(|p| p.split(';').next()).map(str::to_string);
        }
    });
    let console = console.expect("inbox dev prints the console's URL");
    let password = password.expect("inbox dev prints the dev user's password");
    let operator = operator.expect("inbox dev prints the dev user's name");
    assert!(console.ends_with("/console"), "{console}");

    // A viewer, as an operator adds one: the password on stdin.
    let mut add = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["console", "user", "add", "vera", "--role", "viewer", "--password-stdin"])
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    add.stdin.take().unwrap().write_all(b"a viewer's long password\n").unwrap();
    let added = add.wait_with_output().unwrap();
    assert!(added.status.success(), "{}", String::from_utf8_lossy(&added.stdout));

    // Some ordinary traffic: payments (done, each with an outbox message) and GitHub issues (no handler: unhandled).
    for i in 0..12 {
        let body = format!(
            r#"{{"id":"evt_pay_{i}","type":"payment_intent.succeeded","data":{{"object":{{"id":"pi_{i}","amount_received":{},"currency":"usd"}}}}}}"#,
            1000 + i * 250
        );
        let t = inbox_tests::now();
        let signature = format!("t={t},v1={}", inbox_tests::stripe_v1("whsec_dev_stripe_secret", t, body.as_bytes()));
        assert_eq!(post(&addr, "/webhooks/stripe", &[("Stripe-Signature", &signature)], &body), 200);
    }
    for i in 0..6 {
        let body = format!(r#"{{"action":"opened","issue":{{"number":{i},"title":"Refund for order {i}"}}}}"#);
        let signature = inbox_tests::github_signature("dev_github_secret", body.as_bytes());
        let headers = [("X-GitHub-Delivery", format!("gh-delivery-{i}")), ("X-GitHub-Event", "issues".into())];
        let mut headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        headers.push(("X-Hub-Signature-256", &signature));
        assert_eq!(post(&addr, "/webhooks/github", &headers, &body), 200);
    }
    // A ping, which the rules ignore.
    let ping = r#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
    let signature = inbox_tests::github_signature("dev_github_secret", ping.as_bytes());
    let headers = [("X-GitHub-Delivery", "gh-ping-1"), ("X-GitHub-Event", "ping"), ("X-Hub-Signature-256", &signature)];
    assert_eq!(post(&addr, "/webhooks/github", &headers, ping), 200);
    // A deposit to an account that does not exist yet: failed after its one attempt.
    let marqeta = r#"{"transactions":[{"token":"tx_browser_1","type":"gpa.credit","state":"COMPLETION","user_token":"acct_late","amount":"12.50"}]}"#;
    let basic = inbox_tests::marqeta_basic("marqeta", "dev_marqeta_password");
    assert_eq!(post(&addr, "/webhooks/marqeta", &[("Authorization", &basic)], marqeta), 200);
    // A validly signed event whose id and payload are hostile markup (failed: its amount is no number).
    let hostile_id = "evt_<script>window.__pwned=1</script>";
    let hostile = serde_json::json!({
        "id": hostile_id,
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": "<img src=x onerror=window.__pwned=2>", "amount_received": "javascript:window.__pwned=3",
                            "currency": "<a href=\"javascript:window.__pwned=4\">usd</a>"}}
    })
    .to_string();
    let t = inbox_tests::now();
    let signature = format!("t={t},v1={}", inbox_tests::stripe_v1("whsec_dev_stripe_secret", t, hostile.as_bytes()));
    assert_eq!(post(&addr, "/webhooks/stripe", &[("Stripe-Signature", &signature)], &hostile), 200);
    // For the health page: the same delivery again (a duplicate), and one with a wrong signature (rejected).
    assert_eq!(post(&addr, "/webhooks/stripe", &[("Stripe-Signature", &signature)], &hostile), 200);
    let forged = format!("t={t},v1={}", "0".repeat(64));
    assert_eq!(post(&addr, "/webhooks/stripe", &[("Stripe-Signature", &forged)], &hostile), 401);

    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&pool, "marqeta", "transactions:tx_browser_1").await.as_deref() != Some("failed")
        || status(&pool, "stripe", hostile_id).await.as_deref() != Some("failed")
    {
        assert!(Instant::now() < deadline, "both events fail at their one attempt");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The alerts evaluated now, not at dev's next minute.
    let evaluated = Command::new(env!("CARGO_BIN_EXE_inbox")).args(["alerts", "evaluate"]).envs(env).output().unwrap();
    assert!(evaluated.status.success(), "{}", String::from_utf8_lossy(&evaluated.stderr));
    // Now the account exists: a replay succeeds.
    sqlx::query("INSERT INTO accounts (account_id) VALUES ('acct_late')").execute(&pool).await.unwrap();

    let screenshots = repo().join("docs");
    let started = std::time::SystemTime::now();
    let out = Command::new("node")
        .arg(repo().join("tests/console/console.mjs"))
        .envs([
            ("CONSOLE_URL", console.as_str()),
            ("OPERATOR", &operator),
            ("OPERATOR_PASSWORD", &password),
            ("VIEWER", "vera"),
            ("VIEWER_PASSWORD", "a viewer's long password"),
            ("FAILED_PROVIDER", "marqeta"),
            ("FAILED_ID", "transactions:tx_browser_1"),
            ("HOSTILE_ID", hostile_id),
            ("SCREENSHOTS", screenshots.to_str().unwrap()),
            ("CHROMIUM", &chromium),
        ])
        .output()
        .unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{printed}");
    assert!(out.status.success(), "the browser checks failed:\n{printed}");

    // What the browser did, in the database: one replay and one pause and its resume, by the operator, and nothing else.
    assert_eq!(status(&pool, "marqeta", "transactions:tx_browser_1").await.as_deref(), Some("done"));
    assert_eq!(status(&pool, "stripe", hostile_id).await.as_deref(), Some("failed"));
    let audit: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT actor, action, reason, event_id FROM inbox_audit WHERE console_user IS NULL ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let by = format!("console:{operator}");
    assert_eq!(
        audit,
        [
            (by.clone(), "replay".into(), "the account exists now".into(), Some("transactions:tx_browser_1".into())),
            (by.clone(), "pause".into(), "triage bot misbehaving".into(), None),
            (by.clone(), "resume".into(), "resumed from the console".into(), None),
            ("inbox".into(), "resumed".into(), "1 held events released".into(), None),
            (by, "acknowledge_alert".into(), "looking at the deposits".into(), None),
        ]
    );
    assert_eq!(status(&pool, "github", "gh-paused-1").await.as_deref(), Some("unhandled"));
    let balance: String = sqlx::query_scalar("SELECT balance::text FROM accounts WHERE account_id = 'acct_late'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(balance, "12.50", "the replayed deposit was applied once");
    assert_eq!(status(&pool, "github", "gh-ping-1").await.as_deref(), Some("ignored"));
    // Every screenshot the docs show was taken now, by this test.
    for doc in ["README.md", "docs/console.md"] {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        for shot in text.split(['(', ')']).filter(|s| s.ends_with(".png")) {
            let name = Path::new(shot).file_name().unwrap();
            let taken = std::fs::metadata(screenshots.join(name)).and_then(|m| m.modified());
            assert!(taken.is_ok_and(|t| t >= started), "{doc} shows {shot}, which this test did not take");
        }
    }
}

/// One HTTP/1.1 GET; the status code and the whole response.
fn get(addr: &str, path: &str) -> (u16, String) {
    http_exchange(addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"))
}

fn url_of(opts: &PgConnectOptions) -> String {
    format!("postgres://postgres@{}:{}/{}", opts.get_host(), opts.get_port(), opts.get_database().unwrap())
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn inbox_console_serves_the_console_of_a_migrated_database(_: PgPoolOptions, opts: PgConnectOptions) {
    let child = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["console", "--port", "0"])
        .env_clear()
        .envs([
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("RUST_LOG", "warn".into()),
            ("DATABASE_URL", url_of(&opts)),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let line = lines_of(child.0.stdout.take().unwrap()).recv_timeout(Duration::from_secs(60)).expect("a line");
    let addr = line
        .strip_prefix("inbox console ready: http://")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("not the ready line: {line}"))
        .to_string();
    let (status, response) = get(&addr, "/events");
    assert_eq!(status, 303, "{response}");
    assert!(response.to_ascii_lowercase().contains("location: /signin?next=%2fevents"), "{response}");
    let (status, response) = get(&addr, "/signin");
    assert_eq!(status, 200);
    assert!(response.contains("content-security-policy: default-src 'none'"), "{response}");
    assert!(response.contains("<form method=\"post\" action=\"/signin\""), "served at the root: {response}");
}

#[sqlx::test(migrations = false)]
async fn inbox_console_refuses_a_database_without_its_tables_and_says_how(_: PgPoolOptions, opts: PgConnectOptions) {
    let out = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["console", "--port", "0"])
        .env("DATABASE_URL", url_of(&opts))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the console's tables are missing") && stderr.contains("inbox migrate"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_inbox")).args(["console"]).env_remove("DATABASE_URL").output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("DATABASE_URL is not set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn inbox_console_answers_healthz_within_a_second_while_1024_slow_clients_hold_on(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let child = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["console", "--port", "0"])
        .env_clear()
        .envs([
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("RUST_LOG", "warn".into()),
            ("DATABASE_URL", url_of(&opts)),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let line = lines_of(child.0.stdout.take().unwrap()).recv_timeout(Duration::from_secs(60)).expect("a line");
    let addr = line.strip_prefix("inbox console ready: http://").unwrap().split('/').next().unwrap().to_string();
    let slow = inbox_tests::slow_clients(&addr, "/signin", 1024);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..5 {
        let healthz = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        assert_eq!(inbox_tests::answered_within(&addr, &healthz, Duration::from_secs(1)), Some(200), "{i}");
    }
    let page = format!("GET /signin HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let signin = inbox_tests::answered_within(&addr, &page, Duration::from_secs(1));
    assert!(matches!(signin, Some(200 | 503)), "the sign-in page answers at once, if only that it is busy: {signin:?}");
    // A client that never finishes its headers is cut off after the header timeout (10 s).
    let mut stalled = &slow[0];
    stalled.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 256];
    let cut = match std::io::Read::read(&mut stalled, &mut buf) {
        Ok(_) => true,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    };
    assert!(cut, "the half-sent headers' connection was closed");
    drop(slow);
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn inbox_dev_on_a_database_of_yours_changes_no_user_and_leaves_no_account_behind(
    pool_options: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = pool_options.connect_with(opts.clone()).await.unwrap();
    webhook_inbox_console::add_user(
        &pool,
        "dev",
        webhook_inbox_console::UserRole::Viewer,
        "the team's own dev viewer",
        "ops",
    )
    .await
    .unwrap();
    let before: String = sqlx::query_scalar("SELECT password_hash FROM inbox_console_users WHERE name = 'dev'")
        .fetch_one(&pool)
        .await
        .unwrap();
    let (mut child, lines) = inbox_dev(env!("CARGO_BIN_EXE_inbox"), &[("DATABASE_URL", &url_of(&opts))]);
    let mut user = None;
    dev_ready(&lines, |line| {
        if let Some(rest) = line.split("sign in as ").nth(1) {
            user = rest.split(',').next().map(str::to_string);
        }
    });
    let user = user.expect("inbox dev prints the console's user");
    assert!(user.starts_with("dev-") && user.len() == 12, "a name of its own: {user}");
    let users: Vec<(String, String, bool)> =
        sqlx::query_as("SELECT name, role, expires_at IS NOT NULL FROM inbox_console_users ORDER BY name")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(users, [("dev".into(), "viewer".into(), false), (user.clone(), "operator".into(), true)]);
    let after: String = sqlx::query_scalar("SELECT password_hash FROM inbox_console_users WHERE name = 'dev'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(before, after, "the team's dev user is untouched");

    Command::new("kill").args(["-TERM", &child.0.id().to_string()]).status().unwrap();
    assert!(child.0.wait().unwrap().success());
    let names: Vec<String> =
        sqlx::query_scalar("SELECT name FROM inbox_console_users ORDER BY name").fetch_all(&pool).await.unwrap();
    assert_eq!(names, ["dev"], "its own user is gone");
    let audit: Vec<(String, String)> =
        sqlx::query_as("SELECT action, actor FROM inbox_audit WHERE console_user = $1 ORDER BY id")
            .bind(&user)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(audit, [("user_add".into(), "inbox dev".into()), ("user_remove".into(), "inbox dev".into())]);
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("VmRSS: 0 kB");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 100 wrong sign-ins at once, from one client: two passwords are checked at
/// a time (each takes Argon2's 19 MiB), the rest answered at once, so the
/// process stays small.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_flood_of_concurrent_sign_ins_checks_two_passwords_at_a_time_and_stays_small(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let child = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["console", "--port", "0"])
        .env_clear()
        .envs([
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("RUST_LOG", "error".into()),
            ("DATABASE_URL", url_of(&opts)),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let pid = child.0.id();
    let line = lines_of(child.0.stdout.take().unwrap()).recv_timeout(Duration::from_secs(60)).expect("a line");
    let addr = line.strip_prefix("inbox console ready: http://").unwrap().split('/').next().unwrap().to_string();
    let before = rss_kib(pid);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(100));
    let guesses: Vec<_> = (0..100)
        .map(|i| {
            let (addr, barrier) = (addr.clone(), barrier.clone());
            std::thread::spawn(move || {
                let body = format!("name=guess{i}&password=a+wrong+guess");
                let request = format!(
                    "POST /signin HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                barrier.wait();
                http_exchange(&addr, &request).0
            })
        })
        .collect();
    let statuses: Vec<u16> = guesses.into_iter().map(|g| g.join().unwrap()).collect();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    let checked = statuses.iter().filter(|s| **s == 401).count();
    assert!(statuses.iter().all(|s| [401, 429, 503].contains(s)), "{statuses:?}");
    assert!(checked <= 20, "{checked} passwords checked for one client (its limit is 20): {statuses:?}");
    println!("RSS {before} KiB before, {peak} KiB at the peak; {checked} checked");
    assert!(peak < before + 100 * 1024, "RSS grew from {before} KiB to {peak} KiB");
}
