//! Shared by the integration tests: test secrets, independent signers for each
//! provider (written from `docs/providers.md`, not from the product's code), and
//! helpers that drive the real receive handler against a real PostgreSQL.

pub mod cut;
pub mod emf;
pub mod history;
pub mod hostile_json;
pub mod lambda;
pub mod pgbouncer;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use hmac::{Hmac, Mac};
use http::{Method, Request, StatusCode};
use lambda_http::Body;
use serde_json::Value;
use sha2::Sha256;
use sqlx::{postgres::PgConnectOptions, PgPool};
use webhook_inbox::{
    config::{Catalog, DbConfig, MarqetaAuth, Secret, Secrets, DEFAULT_MAX_BODY_BYTES},
    Handlers, ReceiveConfig, Receiver, Worker, WorkerConfig,
};
use webhook_inbox_schemes::Provider;

/// The inbox's migrations, then the stock application's: the schema the stock
/// binaries make, for `#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]`.
/// (sqlx's test harness keeps their history in `_sqlx_migrations`; the
/// product's own runner is tested in `tests/it/migrate.rs`.)
pub static MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> = std::sync::LazyLock::new(|| {
    let both = webhook_inbox_migrations::INBOX.iter().chain(stock::MIGRATIONS.iter());
    sqlx::migrate::Migrator { migrations: both.cloned().collect::<Vec<_>>().into(), ..sqlx::migrate::Migrator::DEFAULT }
});

/// Two secrets per provider: the second is the one being rotated in.
pub const STRIPE: [&str; 2] = ["whsec_test_old", "whsec_test_new"];
pub const SHOPIFY: [&str; 2] = ["shopify_old", "shopify_new"];
pub const GITHUB: [&str; 2] = ["github_old", "github_new"];
/// Standard Webhooks keys, raw; configured as `whsec_<base64>`.
pub const STANDARD: [&[u8]; 2] = [b"standard-old-key", b"standard-new-key"];
pub const MARQETA_USER: &str = "marqeta_user";
pub const MARQETA_PASSWORDS: [&str; 2] = ["marqeta-password-0001", "marqeta-password-0002"];
pub const MARQETA_SIGNING: [&str; 2] = ["marqeta-signing-old", "marqeta-signing-new"];

pub fn secrets(marqeta_signing: bool) -> Secrets {
    let list = |s: &[&str]| s.iter().map(|s| Secret::new(*s)).collect::<Vec<_>>();
    Secrets {
        stripe: list(&STRIPE),
        shopify: list(&SHOPIFY),
        github: list(&GITHUB),
        standard: STANDARD.iter().map(|k| Secret::new(*k)).collect(),
        marqeta: Some(MarqetaAuth {
            username: Secret::new(MARQETA_USER),
            passwords: list(&MARQETA_PASSWORDS),
            signing_secrets: if marqeta_signing { list(&MARQETA_SIGNING) } else { vec![] },
        }),
        declared: Default::default(),
    }
}

pub fn db_config() -> DbConfig {
    DbConfig::with_url("unused: connect options come from the test")
}

pub fn config(secrets: Secrets) -> ReceiveConfig {
    ReceiveConfig {
        db: db_config(),
        catalog: Catalog::builtin(),
        secrets,
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        inline_providers: vec![],
        process_queue_url: None,
        rules: Default::default(),
    }
}

/// A receiver on the test's database, with the production pool settings.
pub fn receiver(opts: PgConnectOptions, secrets: Secrets) -> Receiver {
    let mut cfg = config(secrets);
    cfg.db.pool_size = 8;
    Receiver::connect_with(opts, &cfg)
}

pub fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// An HMAC (`M` = `Hmac<Sha256>`, ...) over the parts in order, with the `hmac` crate directly, as a provider signs.
pub fn hmac<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = <M as Mac>::new_from_slice(key).unwrap();
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

fn hmac256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    hmac::<Hmac<Sha256>>(key, parts)
}

pub fn stripe_v1(secret: &str, t: i64, body: &[u8]) -> String {
    hex::encode(hmac256(secret.as_bytes(), &[t.to_string().as_bytes(), b".", body]))
}

pub fn stripe_header(secret: &str, body: &[u8]) -> String {
    let t = now();
    format!("t={t},v1={}", stripe_v1(secret, t, body))
}

pub fn shopify_hmac(secret: &str, body: &[u8]) -> String {
    B64.encode(hmac256(secret.as_bytes(), &[body]))
}

pub fn github_signature(secret: &str, body: &[u8]) -> String {
    format!("sha256={}", hex::encode(hmac256(secret.as_bytes(), &[body])))
}

pub fn standard_signature(key: &[u8], id: &str, t: i64, body: &[u8]) -> String {
    format!("v1,{}", B64.encode(hmac256(key, &[id.as_bytes(), b".", t.to_string().as_bytes(), b".", body])))
}

pub fn marqeta_basic(user: &str, password: &str) -> String {
    format!("Basic {}", B64.encode(format!("{user}:{password}")))
}

pub fn marqeta_signature_sha256(secret: &str, body: &[u8]) -> String {
    hex::encode(hmac256(secret.as_bytes(), &[body]))
}

pub fn marqeta_signature_sha1(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// A request as `lambda_http` hands it to the handler.
pub fn request(provider: &str, headers: &[(&str, &str)], body: &[u8]) -> Request<Body> {
    let mut b = Request::builder().method(Method::POST).uri(format!("https://example.test/webhooks/{provider}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::from(body.to_vec())).unwrap()
}

/// Sends a request through the real handler; returns the status and the JSON body.
pub async fn send(receiver: &Receiver, req: Request<Body>) -> (StatusCode, Value) {
    let response = receiver.handle(req).await;
    let status = response.status();
    let body: Value = serde_json::from_slice(response.body().as_ref()).expect("every answer is JSON");
    (status, body)
}

pub async fn post(receiver: &Receiver, provider: &str, headers: &[(&str, &str)], body: &[u8]) -> (StatusCode, Value) {
    send(receiver, request(provider, headers, body)).await
}

pub async fn count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM webhook_inbox").fetch_one(pool).await.unwrap()
}

/// One test's app (the `spawn_app` of Zero To Production): the test's own
/// database, freshly migrated by `#[sqlx::test]`, and the real receive handler
/// on it with the test secrets.
pub struct TestApp {
    pub pool: PgPool,
    pub receiver: Receiver,
}

impl TestApp {
    pub async fn spawn(opts: PgConnectOptions, secrets: Secrets) -> TestApp {
        let pool = PgPool::connect_with(opts.clone()).await.expect("the test database");
        TestApp { pool, receiver: receiver(opts, secrets) }
    }

    /// A delivery through the real handler; the status and the JSON answer.
    pub async fn post(&self, provider: &str, headers: &[(&str, &str)], body: &[u8]) -> (StatusCode, Value) {
        post(&self.receiver, provider, headers, body).await
    }

    /// A worker on the app's database with [`fast_worker_config`].
    pub fn worker(&self, handlers: Handlers) -> Worker {
        Worker::new(self.pool.clone(), handlers, fast_worker_config())
    }

    pub async fn scalar<T>(&self, sql: &str) -> T
    where
        T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        scalar(&self.pool, sql).await
    }
}

/// A deadline far enough away not to matter.
pub fn later() -> std::time::Instant {
    std::time::Instant::now() + Duration::from_secs(60)
}

/// One value from one query.
pub async fn scalar<T>(pool: &PgPool, sql: &str) -> T
where
    T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// A worker for tests: three attempts, millisecond backoff, a 10 ms poll.
pub fn fast_worker_config() -> WorkerConfig {
    WorkerConfig {
        batch_size: 100,
        max_attempts: 3,
        retry_base: Duration::from_millis(1),
        poll: Duration::from_millis(10),
        rules: Default::default(),
    }
}

/// Stores a pending event straight through the claim, payload as given (no
/// receive-side check): as receive would, or as a row written before a check
/// existed (the test kit's `store`, which this asserts is new).
pub async fn store(pool: &PgPool, provider: Provider, event_id: &str, event_type: &str, payload: &str) {
    let new = webhook_inbox::testing::store(pool, provider, event_id, event_type, payload).await.unwrap();
    assert!(new, "{event_id} is new");
}

/// RFC 3339 for a Unix time, `2026-12-02T18:00:00Z` (Howard Hinnant's civil-from-days).
pub fn rfc3339(secs: i64) -> String {
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let (d, m) = (doy - (153 * mp + 2) / 5 + 1, if mp < 10 { mp + 3 } else { mp - 9 });
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Polls until `f` is true or 10 s pass.
pub async fn eventually<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A Lambda event from `tests/data/` (the shapes AWS documents), to fill in.
pub fn fixture(name: &str) -> Value {
    let path = format!("{}/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A real API Gateway HTTP API (payload 2.0) event, body base64-encoded as API
/// Gateway does for non-text content types, parsed by `lambda_http` itself.
pub fn apigw_v2_request(provider: &str, headers: &[(&str, &str)], body: &[u8]) -> Request<Body> {
    let event = apigw_v2_event(provider, headers, body);
    lambda_http::request::from_str(&event.to_string()).expect("a valid API Gateway v2 event")
}

/// [`apigw_v2_request`]'s event as JSON: what the Lambda runtime hands the
/// `receive` function's binary.
pub fn apigw_v2_event(provider: &str, headers: &[(&str, &str)], body: &[u8]) -> Value {
    let mut event = fixture("apigw-http-v2.json");
    for (k, v) in headers {
        event["headers"][k.to_ascii_lowercase()] = Value::from(*v);
    }
    event["rawPath"] = Value::from(format!("/webhooks/{provider}"));
    event["requestContext"]["http"]["path"] = event["rawPath"].clone();
    event["pathParameters"]["provider"] = Value::from(provider);
    event["body"] = Value::from(B64.encode(body));
    event
}

/// The status and the JSON body of the answer a function behind API Gateway
/// (payload 2.0) gave, as the Lambda runtime took it.
pub fn apigw_v2_answer(answer: &Value) -> (StatusCode, Value) {
    let status = answer["statusCode"].as_u64().and_then(|s| StatusCode::from_u16(s as u16).ok());
    let body = answer["body"].as_str().unwrap_or_default();
    let body = if answer["isBase64Encoded"] == true { B64.decode(body).unwrap() } else { body.as_bytes().to_vec() };
    let body = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}: an answer that is not JSON: {answer}"));
    (status.unwrap_or_else(|| panic!("no status code: {answer}")), body)
}

/// A moto server (the AWS emulator from PyPI) on a free loopback port, killed on drop.
pub struct Moto {
    child: std::process::Child,
    pub url: String,
}

impl Moto {
    pub fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("moto_server is not installed: `pip install 'moto[server]'` (.ci/run does)");
        let moto = Moto { child, url: format!("http://127.0.0.1:{port}") };
        for _ in 0..300 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return moto;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("moto_server did not listen on {port} within 15 s");
    }

    /// AWS configuration pointed at this server, with throwaway credentials.
    pub async fn aws(&self) -> aws_config::SdkConfig {
        for (k, v) in
            [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_REGION", "us-east-1")]
        {
            std::env::set_var(k, v);
        }
        webhook_inbox::config::aws_sdk(Some(&self.url)).await
    }

    /// Makes an S3 bucket (prune's archive, `tests/it/archive.rs`).
    pub async fn bucket(&self, name: &str) {
        webhook_inbox::archive::s3_client(&self.aws().await).create_bucket().bucket(name).send().await.unwrap();
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process (`inbox dev`, `inbox console`) that a failed assertion
/// must not leave running: SIGTERM and a wait when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = std::process::Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
            let _ = self.0.wait();
        }
    }
}

/// Every line `from` prints (read to the end on a thread of its own, so that
/// its last lines find a reader), handed over as they come.
pub fn lines_of(from: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead as _;
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(from).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    lines
}

/// `inbox dev --port 0` (the binary `bin`, as a test names it with
/// `env!("CARGO_BIN_EXE_inbox")`) with nothing inherited but `PATH`, warnings
/// logged (`RUST_LOG` in `env` overrides it) and `env`; its stdout line by line.
pub fn inbox_dev(bin: &str, env: &[(&str, &str)]) -> (KillOnDrop, std::sync::mpsc::Receiver<String>) {
    let mut child = std::process::Command::new(bin)
        .args(["dev", "--port", "0"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    (KillOnDrop(child), lines)
}

/// Reads `inbox dev`'s `lines` up to its ready line, each earlier one shown
/// to `seen` (within two minutes: a first embedded PostgreSQL is slow); the
/// address it serves, `host:port`.
pub fn dev_ready(lines: &std::sync::mpsc::Receiver<String>, mut seen: impl FnMut(&str)) -> String {
    loop {
        let line = lines.recv_timeout(Duration::from_secs(120)).expect("inbox dev prints ready");
        println!("inbox dev: {line}");
        if line.contains("ready") {
            if let Some(url) = line.split_whitespace().find(|w| w.starts_with("http://")) {
                return url.trim_start_matches("http://").split('/').next().unwrap().to_string();
            }
        }
        seen(&line);
    }
}

/// One HTTP/1.1 exchange over a new connection (the request written as is):
/// the status code and the whole response.
pub fn http_exchange(addr: &str, request: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    (response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), response)
}

/// `n` slow clients of `path` at `addr`, held open until dropped: the first
/// half stop in the middle of their headers, the others in the middle of a
/// body they said would be 1,000 bytes. Each is connected and has sent what
/// it sends when this returns.
pub fn slow_clients(addr: &str, path: &str, n: usize) -> Vec<std::net::TcpStream> {
    use std::io::Write as _;
    (0..n)
        .map(|i| {
            let mut stream = std::net::TcpStream::connect(addr).unwrap();
            let head =
                format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\n");
            let sent = if i < n / 2 {
                format!("{head}Content-Len")
            } else {
                format!("{head}Content-Length: 1000\r\n\r\nname=olga&password=")
            };
            stream.write_all(sent.as_bytes()).unwrap();
            stream
        })
        .collect()
}

/// The status of one HTTP exchange answered within `within`, else `None`.
pub fn answered_within(addr: &str, request: &str, within: Duration) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    let started = std::time::Instant::now();
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let mut stream = std::net::TcpStream::connect_timeout(&addr, within).ok()?;
    stream.set_read_timeout(Some(within.saturating_sub(started.elapsed()).max(Duration::from_millis(1)))).unwrap();
    stream.write_all(request.as_bytes()).ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    (started.elapsed() <= within).then(|| String::from_utf8_lossy(&head[9..12]).parse().ok()).flatten()
}
