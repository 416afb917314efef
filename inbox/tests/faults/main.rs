//! The fault suite: the storm of `inbox demo`, sent as providers send (each
//! delivery retried until it is acknowledged), while something breaks; then
//! the database is checked against what was sent. One figure line per
//! scenario: deliveries, acknowledged, lost, duplicated effects, recovered.
//!
//! Each scenario runs `inbox dev` on a throwaway PostgreSQL cluster of its own,
//! never the machine's. The CI size runs by default; `INBOX_FAULTS=full` runs
//! the full size (at least 5,000 deliveries) and writes `docs/reliability.md`.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use inbox_tests::{cut::forward_until, pgbouncer::PgBouncer};
use webhook_inbox::sinks::http_client;
use webhook_inbox_service::dev::EmbeddedPostgres;

mod table;

/// `inbox demo`'s storm: the same deliveries, signed as each provider signs, and the invariants.
#[path = "../../src/demo/storm.rs"]
mod storm;

use storm::{Consumer, Delivery, Rng};

fn full() -> bool {
    std::env::var("INBOX_FAULTS").is_ok_and(|v| v == "full")
}

/// How the stacks reach PostgreSQL.
#[derive(Clone, Copy, PartialEq)]
enum Route {
    Direct,
    /// Through [`cutting_proxy`].
    Cutting,
    /// Through PgBouncer in transaction pooling, with `INBOX_DB_POOLER=proxy`.
    PgBouncer,
}

/// The database a stack uses, and the stack's settings beyond the suite's own.
#[derive(Clone)]
struct Link {
    url: String,
    pooled: bool,
    env: &'static [(&'static str, &'static str)],
}

/// `inbox dev` on `link`, killed when dropped.
struct Stack {
    child: Child,
    base: String,
}

/// What a scenario's fault injector works with.
struct Ctx {
    /// The stack the storm is sent to (restartable).
    stack: Arc<Mutex<Option<Stack>>>,
    pg: Arc<Mutex<EmbeddedPostgres>>,
    /// The database the stacks use (the cluster, the cutting proxy or PgBouncer).
    link: Link,
    sink: String,
    port: u16,
    /// Set once the whole storm was acknowledged: time to stop injecting.
    done: Arc<AtomicUsize>,
    /// Connections the cutting proxy cut, if there is one.
    cuts: Arc<AtomicUsize>,
    bouncer: Option<Arc<Mutex<PgBouncer>>>,
}

impl Ctx {
    fn storming(&self) -> bool {
        self.done.load(Ordering::SeqCst) == 0
    }

    /// Kills the stack with SIGKILL and starts another on the same port.
    async fn kill9_and_restart(&self) {
        let (link, sink, port, stack) = (self.link.clone(), self.sink.clone(), self.port, self.stack.clone());
        tokio::task::spawn_blocking(move || {
            let mut guard = stack.lock().unwrap();
            if let Some(mut s) = guard.take() {
                s.kill9();
            }
            *guard = Some(Stack::start(&link, &sink, port));
        })
        .await
        .unwrap();
    }
}

/// The session settings every stack runs with: a short idle-in-transaction
/// timeout, so that a frozen worker's rows go back to the others quickly.
const STACK_ENV: [(&str, &str); 1] = [("INBOX_IDLE_IN_TRANSACTION_TIMEOUT_MS", "1000")];

/// Groups that stay open 3 ms on a single committer: every delivery in flight
/// is in a group being gathered or committed when the stack is killed.
const GROUPS: &[(&str, &str)] = &[("INBOX_GROUP_COMMIT_WAIT_US", "3000"), ("INBOX_GROUP_COMMIT_COMMITTERS", "1")];

impl Stack {
    fn start(link: &Link, sink: &str, port: u16) -> Stack {
        let mut child = Command::new(env!("CARGO_BIN_EXE_inbox"))
            .args(["dev", "--stock", "--port", &port.to_string()])
            .env_clear()
            .envs([
                ("PATH", std::env::var("PATH").unwrap_or_default()),
                ("RUST_LOG", std::env::var("INBOX_FAULTS_LOG").unwrap_or_else(|_| "off".into())),
                ("DATABASE_URL", link.url.clone()),
                ("INBOX_DB_POOLER", if link.pooled { "proxy" } else { "none" }.into()),
                ("INBOX_POLL_MS", "50".into()),
                ("INBOX_RETRY_BASE_MS", "100".into()),
                ("RELAY_HTTP_URL", sink.to_string()),
                ("RELAY_RETRY_BASE_MS", "100".into()),
                // Many in flight (the consumer answers in 0 to 19 ms) whenever the stack is killed.
                ("RELAY_CONCURRENCY", "32".into()),
                // A relay killed between publish and mark re-sends when its lease ends.
                ("RELAY_LEASE_MS", "2000".into()),
            ])
            .envs(STACK_ENV)
            .envs(link.env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(if std::env::var("INBOX_FAULTS_LOG").is_ok() { Stdio::inherit() } else { Stdio::null() })
            .spawn()
            .unwrap();
        let (ready_tx, ready) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("inbox dev ready") {
                    let _ = ready_tx.send(());
                }
            }
        });
        ready.recv_timeout(Duration::from_secs(60)).expect("inbox dev did not become ready");
        Stack { child, base: format!("http://127.0.0.1:{port}/webhooks") }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    fn signal(&self, signal: &str) {
        Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap();
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// What the providers saw.
#[derive(Default)]
struct Sent {
    deliveries: usize,
    attempts: AtomicUsize,
    acknowledged: AtomicUsize,
    refused_forged: AtomicUsize,
    /// Deliveries that failed at least once (no answer, 5xx) before their 200.
    recovered: AtomicUsize,
    /// Answers 503: the inbox said it could not store.
    unavailable: AtomicUsize,
}

/// Sends every delivery as a provider does: again until it is acknowledged
/// (a forged one until it is refused), 8 at a time.
async fn send_all(base: String, waves: Vec<Vec<Delivery>>, sent: Arc<Sent>) {
    let client = http_client(Duration::from_secs(10)).unwrap();
    for wave in waves {
        let queue = Arc::new(Mutex::new(wave.into_iter()));
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (queue, client, base, sent) = (queue.clone(), client.clone(), base.clone(), sent.clone());
                tokio::spawn(async move {
                    loop {
                        let Some(d) = queue.lock().unwrap().next() else { return };
                        let mut failed_once = false;
                        loop {
                            sent.attempts.fetch_add(1, Ordering::Relaxed);
                            let url = format!("{base}/{}", d.provider);
                            let mut req = client.post(url).body(d.body.clone());
                            for (k, v) in &d.headers {
                                req = req.header(*k, v);
                            }
                            let status = req.send().await.map(|r| r.status().as_u16()).unwrap_or(0);
                            match (status, d.forged) {
                                (200, false) => {
                                    sent.acknowledged.fetch_add(1, Ordering::Relaxed);
                                    if failed_once {
                                        sent.recovered.fetch_add(1, Ordering::Relaxed);
                                    }
                                    break;
                                }
                                (401, true) => {
                                    sent.refused_forged.fetch_add(1, Ordering::Relaxed);
                                    break;
                                }
                                (200, true) => panic!("a forged delivery was acknowledged"),
                                (401, false) => panic!("a signed delivery was refused"),
                                (code, _) => {
                                    if code == 503 {
                                        sent.unavailable.fetch_add(1, Ordering::Relaxed);
                                    }
                                    failed_once = true;
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.unwrap();
        }
        // Late retries come after the first copies were processed.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A scenario's figures.
struct Figures {
    scenario: &'static str,
    injected: String,
    deliveries: usize,
    acknowledged: usize,
    lost: usize,
    duplicated: usize,
    recovered: usize,
    /// Answers 503: the inbox said it could not store, so the sender retried.
    unavailable: usize,
    /// Outbox messages the consumer received more than once, under the same key
    /// (a relay stopped between publishing and marking sends again).
    resent: usize,
    /// Wall time of the scenario, cluster start to checks.
    seconds: u64,
}

impl Figures {
    fn line(&self) -> String {
        format!(
            "{}: {}; {} deliveries sent, {} acknowledged, lost {}, duplicated effects {}, recovered {} ({} answers 503, {} messages re-sent under their key) in {} s",
            self.scenario,
            self.injected,
            self.deliveries,
            self.acknowledged,
            self.lost,
            self.duplicated,
            self.recovered,
            self.unavailable,
            self.resent,
            self.seconds
        )
    }
}

/// Lost: acknowledged events missing from the inbox. Duplicated: effects
/// applied twice (outbox messages sharing a key, balances above the sum of
/// unique deposits, payments for an unknown or repeated intent).
async fn tally(pool: &sqlx::PgPool, expected: &storm::Expected) -> (usize, usize) {
    let rows: BTreeSet<(String, String)> = sqlx::query_as("SELECT provider, event_id FROM webhook_inbox")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let lost = expected.events.difference(&rows).count();
    let (messages, keys): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT message_key) FROM transactional_outbox")
            .fetch_one(pool)
            .await
            .unwrap();
    let mut want = std::collections::BTreeMap::<String, i64>::new();
    for (account, cents) in expected.deposits.values() {
        *want.entry(account.clone()).or_default() += cents;
    }
    let balances: Vec<(String, i64)> =
        sqlx::query_as("SELECT account_id, (balance * 100)::bigint FROM accounts").fetch_all(pool).await.unwrap();
    let over = balances.iter().filter(|(a, b)| *b > want.get(a).copied().unwrap_or(0)).count();
    (lost, (messages - keys) as usize + over)
}

/// Runs the storm against `inbox dev` on a cluster of its own, reached by
/// `route`, while `inject` breaks things until the storm is sent; then checks
/// everything.
async fn scenario<F, Fut>(
    name: &'static str,
    size: usize,
    route: Route,
    env: &'static [(&'static str, &'static str)],
    inject: F,
) -> Option<Figures>
where
    F: FnOnce(Ctx) -> Fut,
    Fut: std::future::Future<Output = String> + Send + 'static,
{
    // `INBOX_FAULTS_ONLY=<part of a name>` runs that scenario alone.
    if std::env::var("INBOX_FAULTS_ONLY").is_ok_and(|only| !name.contains(only.as_str())) {
        return None;
    }
    let pg = EmbeddedPostgres::start().await.unwrap();
    let url = pg.url();
    let cuts = Arc::new(AtomicUsize::new(0));
    let armed = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    // 4 server sessions shared by inbox dev's 16 connections.
    let bouncer = (route == Route::PgBouncer)
        .then(|| Arc::new(Mutex::new(PgBouncer::start("127.0.0.1", pg.port(), 4, "transaction"))));
    let link = match route {
        Route::Direct => Link { url: url.clone(), pooled: false, env },
        Route::Cutting => Link { url: cutting_proxy(pg.port(), cuts.clone(), armed.clone()).await, pooled: false, env },
        Route::PgBouncer => {
            let port = bouncer.as_ref().unwrap().lock().unwrap().port;
            Link { url: format!("postgres://postgres@127.0.0.1:{port}/postgres"), pooled: true, env }
        }
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (sink, consumer) = Consumer::start(None).await.unwrap();
    let stack = Arc::new(Mutex::new(Some(Stack::start(&link, &sink, port))));
    // The proxy starts cutting once the stack is up (its migrations done).
    armed.store(1, Ordering::SeqCst);
    let base = stack.lock().unwrap().as_ref().unwrap().base.clone();
    let pool = webhook_inbox::config::DbConfig::with_url(&url).pool().unwrap();
    sqlx::query("INSERT INTO accounts (account_id) SELECT 'acct_demo_' || i FROM generate_series(0, 4) AS i")
        .execute(&pool)
        .await
        .unwrap();

    let (waves, expected) = storm::storm(size, &mut Rng(0xfa17_5eed_0000_0001 ^ size as u64));
    let sent = Arc::new(Sent { deliveries: waves.iter().map(Vec::len).sum(), ..Sent::default() });
    let pg = Arc::new(Mutex::new(pg));
    let done = Arc::new(AtomicUsize::new(0));
    let bouncer_log = bouncer.clone();
    let ctx = Ctx { stack: stack.clone(), pg: pg.clone(), link, sink, port, done: done.clone(), cuts, bouncer };
    let injector = tokio::spawn(inject(ctx));
    send_all(base, waves, sent.clone()).await;
    done.store(1, Ordering::SeqCst);
    let injected = injector.await.unwrap();

    // Whatever was broken is back: the pipeline settles, then every invariant holds.
    if !storm::wait_settled(&pool, Duration::from_secs(120)).await.unwrap() {
        let inbox = webhook_inbox::ops::inbox_gauges(&pool).await.unwrap();
        let outbox = webhook_inbox::ops::outbox_gauges(&pool).await.unwrap();
        let pending: (Option<String>, Option<i32>, i64) = sqlx::query_as(
            "SELECT max(next_attempt_at - now())::text, max(attempts), count(*) FILTER (WHERE next_attempt_at > now())
             FROM webhook_inbox WHERE status = 'pending'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let activity: Vec<(Option<String>, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT state, wait_event_type || ':' || wait_event, left(query, 80) FROM pg_stat_activity WHERE datname = 'postgres'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let bouncer = bouncer_log.map(|b| b.lock().unwrap().log()).unwrap_or_default();
        let bouncer = &bouncer[bouncer.len().saturating_sub(6000)..];
        panic!("{name}: the pipeline did not settle: {inbox:?} {outbox:?}\npending (longest wait, most attempts, in backoff): {pending:?}\n{activity:#?}\n{bouncer}");
    }
    let checks = storm::check(&pool, &expected, sent.refused_forged.load(Ordering::Relaxed)).await.unwrap();
    let (lost, duplicated) = tally(&pool, &expected).await;
    let figures = Figures {
        scenario: name,
        injected,
        deliveries: sent.deliveries,
        acknowledged: sent.acknowledged.load(Ordering::Relaxed),
        lost,
        duplicated,
        recovered: sent.recovered.load(Ordering::Relaxed),
        unavailable: sent.unavailable.load(Ordering::Relaxed),
        resent: {
            let consumer = consumer.lock().unwrap();
            consumer.accepted.values().map(|bodies| bodies.len() - 1).sum()
        },
        seconds: started.elapsed().as_secs(),
    };
    println!("{}", figures.line());
    for (ok, what) in &checks {
        assert!(ok, "{name}: {what}");
    }
    assert_eq!((lost, duplicated), (0, 0), "{}", figures.line());
    // Every message reached the consumer; a relay killed between publish and mark sent some twice, under one key.
    let keys: BTreeSet<String> = sqlx::query_scalar("SELECT message_key FROM transactional_outbox")
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let received: BTreeSet<String> = consumer.lock().unwrap().accepted.keys().cloned().collect();
    assert_eq!(received, keys, "{name}: every outbox message delivered");
    // Order per key (an account's balance updates): each first arrived after the one written before it.
    let keyed: Vec<(String, String)> = sqlx::query_as(
        "SELECT ordering_key, message_key FROM transactional_outbox WHERE ordering_key IS NOT NULL ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(keyed.len() > 1, "{name}: the storm writes messages with an ordering key");
    let arrived: std::collections::HashMap<String, usize> =
        consumer.lock().unwrap().order.iter().enumerate().map(|(i, k)| (k.clone(), i)).collect();
    let mut last: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (ordering_key, message_key) in &keyed {
        let at = arrived[message_key];
        if let Some(before) = last.insert(ordering_key, at) {
            assert!(before < at, "{name}: {message_key} arrived before the message written before it ({ordering_key})");
        }
    }
    drop(stack);
    let pg = Arc::try_unwrap(pg).ok().expect("the injector is done").into_inner().unwrap();
    pg.destroy().await.unwrap();
    Some(figures)
}

fn size() -> usize {
    if full() {
        800
    } else {
        150
    }
}

/// A pause between faults, 300 to 1200 ms, from a fixed sequence.
fn pause(rng: &mut Rng) -> Duration {
    Duration::from_millis(300 + rng.below(900) as u64)
}

/// A TCP proxy to PostgreSQL that, now and then, forwards a client's `COMMIT`
/// (or the Sync that ends an autocommit statement, outside a transaction as the
/// server's last ReadyForQuery said) and then cuts both sides before the answer
/// can come back: the client cannot know whether it committed.
async fn cutting_proxy(pg_port: u16, cuts: Arc<AtomicUsize>, armed: Arc<AtomicUsize>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let counter = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", pg_port)).await else { continue };
            // Message by message, so no Nagle delay: each would otherwise wait for the peer's delayed ACK.
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (cuts, counter, armed) = (cuts.clone(), counter.clone(), armed.clone());
            tokio::spawn(async move {
                let (client_read, mut client_write) = client.into_split();
                let (mut server_read, server_write) = server.into_split();
                // Server to client, watching ReadyForQuery ('Z') for the transaction status.
                let in_transaction = Arc::new(AtomicUsize::new(0));
                let status = in_transaction.clone();
                let back = tokio::spawn(async move {
                    loop {
                        let mut head = [0u8; 5];
                        server_read.read_exact(&mut head).await?;
                        let len = u32::from_be_bytes(head[1..].try_into().unwrap()) as usize;
                        let mut body = vec![0u8; len.saturating_sub(4)];
                        server_read.read_exact(&mut body).await?;
                        if head[0] == b'Z' {
                            status.store(usize::from(body.first() != Some(&b'I')), Ordering::SeqCst);
                        }
                        client_write.write_all(&[&head[..], &body].concat()).await?;
                    }
                    #[allow(unreachable_code)]
                    Ok::<(), std::io::Error>(())
                });
                let cut = |tag: u8, body: &[u8]| {
                    let commit = tag == b'Q' && body.len() >= 6 && body[..6].eq_ignore_ascii_case(b"COMMIT");
                    let autocommit = tag == b'S' && in_transaction.load(Ordering::SeqCst) == 0;
                    if armed.load(Ordering::SeqCst) == 0 || !(commit || autocommit) {
                        return false;
                    }
                    // One in ten, drawn (not every tenth: a client that polls on a timer could
                    // fall in step with a fixed period and be cut on every try).
                    let cutting = splitmix(counter.fetch_add(1, Ordering::Relaxed) as u64) % 10 == 0;
                    if cutting {
                        cuts.fetch_add(1, Ordering::Relaxed);
                    }
                    cutting
                };
                forward_until(client_read, server_write, back, cut, Duration::from_millis(20)).await;
            });
        }
    });
    format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=disable")
}

/// SplitMix64's mixer: consecutive inputs give unrelated outputs.
fn splitmix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
