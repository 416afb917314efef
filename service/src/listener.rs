//! The long-running servers' HTTP listener (`inbox serve`, `inbox dev`,
//! `inbox console`): the very same [`Receiver::handle`] as the Lambda at
//! `/webhooks/{provider}` behind a plain HTTP/1.1 listener, and the other
//! routes (the console, the health checks) from an axum router. Slow clients
//! are cut off everywhere: each request's headers and body have their
//! timeouts, the bodies in memory a budget, the connections a cap, and the
//! console's pages a share of the requests in flight (past it they are
//! answered 503 at once), so that whatever the console's clients do, the
//! webhooks and the health checks keep their connections. On shutdown it
//! stops accepting, lets every request in flight finish (a delivery is
//! answered once its claim has committed), closes idle connections, and past
//! its drain timeout answers what is left 503.

use std::{convert::Infallible, future::Future, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{header::CONTENT_LENGTH, request::Parts, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, SemaphorePermit},
};
use tower::ServiceExt as _;

use webhook_inbox::{
    config::{ConfigError, Env},
    host::{respond, Metrics, ReceiveError},
    Receiver,
};
use webhook_inbox_console::{client_key, ClientIp};

/// What a listener allows its clients, from the environment
/// ([`Limits::read`]): how long a client may take to send each request's
/// headers (an idle keep-alive connection included), then its body (a client
/// that dawdles is cut off, so slow clients cannot hold connections for
/// ever); how many connections are served at once (past it, new ones wait in
/// the listener's backlog rather than take a descriptor each); and how many of
/// the console's requests at once (past it, a console request is answered
/// 503 at once and its connection closed, so that slow console clients hold
/// no more connections than that), and how many of those one client may hold
/// (so that one client's slow bodies leave the others their share).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `INBOX_HEADER_TIMEOUT_MS`, 10 s.
    pub header_timeout: Duration,
    /// `INBOX_BODY_TIMEOUT_MS`, 30 s.
    pub body_timeout: Duration,
    /// `INBOX_MAX_CONNECTIONS`, 4096, or fewer where the open-files limit
    /// leaves less room (that limit, raised to its hard limit, less 256 for the rest).
    pub max_connections: usize,
    /// `INBOX_CONSOLE_MAX_IN_FLIGHT`, 64.
    pub console_in_flight: usize,
    /// `INBOX_CONSOLE_MAX_IN_FLIGHT_PER_CLIENT`, a quarter of
    /// [`Limits::console_in_flight`] (16): one client's requests at once, the
    /// client as [`Limits::client_ip`] says.
    pub console_in_flight_per_client: usize,
    /// `INBOX_CONSOLE_CLIENT_IP`: where a client's address comes from.
    pub client_ip: ClientIp,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 4096,
            console_in_flight: 64,
            console_in_flight_per_client: 16,
            client_ip: ClientIp::Peer,
        }
    }
}

impl Limits {
    /// The limits the environment sets, the defaults where it sets none.
    pub fn read(env: &Env) -> Result<Limits, ConfigError> {
        let d = Limits::default();
        let ms = |name, default: Duration| -> Result<Duration, ConfigError> {
            Ok(Duration::from_millis(env.positive(name, default.as_millis() as u64)?))
        };
        let console_in_flight = env.positive("INBOX_CONSOLE_MAX_IN_FLIGHT", d.console_in_flight)?;
        let per_client = (console_in_flight / 4).max(1);
        Ok(Limits {
            header_timeout: ms("INBOX_HEADER_TIMEOUT_MS", d.header_timeout)?,
            body_timeout: ms("INBOX_BODY_TIMEOUT_MS", d.body_timeout)?,
            max_connections: env.positive("INBOX_MAX_CONNECTIONS", d.max_connections)?,
            console_in_flight,
            console_in_flight_per_client: env.positive("INBOX_CONSOLE_MAX_IN_FLIGHT_PER_CLIENT", per_client)?,
            client_ip: ClientIp::read(env)?,
        })
    }
}

/// Request bodies read at once, in bytes: each in full before it is verified,
/// so this bounds what slow bodies can hold (the rest wait their turn, within
/// their body timeout), whatever the number of connections.
pub(crate) const MAX_BODY_BYTES_IN_FLIGHT: usize = 64 * 1024 * 1024;

/// The largest body a routed request (the console's forms) may send.
pub(crate) const MAX_ROUTED_BODY_BYTES: usize = 64 * 1024;

/// How many connections a listener serves at once: `max`, or fewer where
/// the open-files limit (raised to its hard limit first) leaves less, with
/// room for the database's connections and the rest.
pub(crate) fn connection_cap(max: usize) -> usize {
    #[cfg(target_os = "linux")]
    {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit and setrlimit read and write the struct given, nothing else.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                if limit.rlim_cur < limit.rlim_max {
                    let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                        limit.rlim_cur = limit.rlim_max;
                    }
                }
                // Room for the database's connections, the log, and the rest.
                let open = limit.rlim_cur.saturating_sub(256);
                return usize::try_from(open).unwrap_or(usize::MAX).clamp(64.min(max), max);
            }
        }
    }
    max
}

/// Answers a request from its head alone, or lets it through (`None`).
pub(crate) type HeadCheck = fn(&Parts) -> Option<Response<axum::body::Body>>;

/// What a listener serves.
#[derive(Clone)]
pub(crate) struct Site {
    /// `POST /webhooks/{provider}` (any path the router does not take); without
    /// it, such a path is answered 404.
    pub receiver: Option<Arc<Receiver>>,
    /// The paths [`Site::routed`] names: the console at [`webhook_inbox_console::PATH`], `/healthz`, `/readyz`, `/metrics`.
    pub router: Option<axum::Router>,
    /// What the router takes.
    pub routed: fn(&str) -> bool,
    /// Of those, the console's pages: [`Limits::console_in_flight`] at once.
    pub paged: fn(&str) -> bool,
    /// Answers a routed request before its share is taken and its body read,
    /// when it can be refused from its head alone (the management API's
    /// requests without a token's form).
    pub head_check: Option<HeadCheck>,
    /// Where each delivery's counts and time go (`inbox serve`'s Prometheus metrics).
    pub count: Option<fn(&Metrics, Duration)>,
    /// Called once the listening socket is closed at shutdown: from then on a
    /// new connection is refused.
    pub closed: Option<fn()>,
}

impl Site {
    /// Webhooks only.
    pub(crate) fn webhooks(receiver: Arc<Receiver>) -> Self {
        Site {
            receiver: Some(receiver),
            router: None,
            routed: |_| false,
            paged: |_| false,
            head_check: None,
            count: None,
            closed: None,
        }
    }
}

/// The console's paths beside the webhooks.
pub(crate) fn console(path: &str) -> bool {
    path == webhook_inbox_console::PATH || path.starts_with("/console/")
}

/// The console's paths, and the health checks (`/healthz`, `/readyz`).
pub(crate) fn console_or_health(path: &str) -> bool {
    console(path) || matches!(path, "/healthz" | "/readyz")
}

/// Serves `site` until `shutdown` completes, then drains: no new connection,
/// each request in flight finished and each idle connection closed, within
/// `drain`; past it, the requests still in flight are answered 503 (the
/// provider sends again; nothing it was told of is lost). Returns how many
/// requests were answered 503 at the end of the drain.
pub(crate) async fn serve_site(
    listener: TcpListener,
    site: Site,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> usize {
    tokio::pin!(shutdown);
    let cap = connection_cap(limits.max_connections);
    let connections = Arc::new(Semaphore::new(cap));
    let bodies = Arc::new(Semaphore::new(MAX_BODY_BYTES_IN_FLIGHT / 1024));
    let pages = Arc::new(Shares::new(limits));
    // `true` once draining; each connection finishes its request and closes.
    let (draining, drained) = tokio::sync::watch::channel(false);
    // Set at the end of the drain: what is still in flight is answered 503.
    let (give_up, given_up) = tokio::sync::watch::channel(false);
    let cut = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut backoff = Duration::ZERO;
    loop {
        let slot = tokio::select! {
            slot = connections.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => {
                    backoff = Duration::ZERO;
                    conn
                }
                Err(e) => {
                    // Out of descriptors (EMFILE), say: wait before trying again, rather than spin.
                    backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    tracing::warn!(error = %e, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => continue,
                        () = &mut shutdown => break,
                    }
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (site, bodies, pages, mut drained, given_up, cut) =
            (site.clone(), bodies.clone(), pages.clone(), drained.clone(), given_up.clone(), cut.clone());
        tokio::spawn(async move {
            let _slot = slot; // given back when the connection ends
            let service = service_fn(move |req: Request<Incoming>| {
                let (site, bodies, pages, mut given_up, cut) =
                    (site.clone(), bodies.clone(), pages.clone(), given_up.clone(), cut.clone());
                async move {
                    let answer = route(&site, &bodies, &pages, req, peer, limits.body_timeout);
                    let response = tokio::select! {
                        response = answer => response,
                        () = async move { let _ = given_up.wait_for(|g| *g).await; } => {
                            cut.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            unavailable()
                        }
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let draining = async move {
                let _ = drained.wait_for(|d| *d).await;
            };
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                () = draining => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
    drop(listener);
    if let Some(closed) = site.closed {
        closed();
    }
    let _ = draining.send(true);
    // Every connection gives its slot back when it ends.
    let all = cap as u32;
    if tokio::time::timeout(drain, connections.acquire_many(all)).await.is_err() {
        let _ = give_up.send(true);
        // The 503s written, the connections closed (a stuck client is left to its timeouts).
        let _ = tokio::time::timeout(Duration::from_secs(1), connections.acquire_many(all)).await;
    }
    cut.load(std::sync::atomic::Ordering::Relaxed)
}

/// The console's requests in flight: all of them, and each client's.
struct Shares {
    all: Semaphore,
    per_client: usize,
    client_ip: ClientIp,
    /// Each client's requests in flight; an entry leaves with its last request.
    clients: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

/// One request's place among the console's: given back when dropped.
struct Share<'a> {
    shares: &'a Shares,
    client: String,
    _all: SemaphorePermit<'a>,
}

impl Shares {
    fn new(limits: Limits) -> Shares {
        Shares {
            all: Semaphore::new(limits.console_in_flight),
            per_client: limits.console_in_flight_per_client,
            client_ip: limits.client_ip,
            clients: Default::default(),
        }
    }

    /// A place for a request of this client, at once or none.
    fn take(&self, parts: &Parts, peer: SocketAddr) -> Option<Share<'_>> {
        let client = client_key(&self.client_ip.client(&parts.headers, Some(peer)));
        let all = self.all.try_acquire().ok()?;
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let held = clients.entry(client.clone()).or_insert(0);
        if *held >= self.per_client {
            return None;
        }
        *held += 1;
        Some(Share { shares: self, client, _all: all })
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        let mut clients = self.shares.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = clients.get_mut(&self.client) {
            *held -= 1;
            if *held == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

/// The router's paths to the router (the console's within its share and its
/// client's, each body read first, under the body timeout; what the head check
/// refuses, before either), the rest to the receiver.
async fn route(
    site: &Site,
    bodies: &Semaphore,
    pages: &Shares,
    req: Request<Incoming>,
    peer: SocketAddr,
    body_timeout: Duration,
) -> Response<axum::body::Body> {
    let path = req.uri().path();
    let Some(router) = site.router.clone().filter(|_| (site.routed)(path)) else {
        return match &site.receiver {
            Some(receiver) => handle(receiver, bodies, req, body_timeout, site.count).await.map(axum::body::Body::new),
            None => respond(Err(ReceiveError::NoRoute)).map(|b| axum::body::Body::from(b.as_ref().to_vec())),
        };
    };
    let (mut parts, body) = req.into_parts();
    if let Some(refused) = site.head_check.and_then(|check| check(&parts)) {
        return closing(refused);
    }
    let _share = if (site.paged)(parts.uri.path()) {
        match pages.take(&parts, peer) {
            Some(share) => Some(share),
            None => return closing(busy()),
        }
    } else {
        None
    };
    parts.extensions.insert(axum::extract::ConnectInfo::<SocketAddr>(peer));
    match read_body(bodies, &parts, body, MAX_ROUTED_BODY_BYTES, body_timeout).await {
        Ok((_budget, body)) => {
            let req = Request::from_parts(parts, axum::body::Body::from(body));
            router.oneshot(req).await.unwrap_or_else(|never| match never {})
        }
        Err(unread) => unread.response(MAX_ROUTED_BODY_BYTES).map(|b| axum::body::Body::from(b.as_ref().to_vec())),
    }
}

/// Why a body was not read.
enum Unread {
    TooLarge,
    Failed,
    TimedOut,
}

impl Unread {
    fn response(self, limit: usize) -> Response<lambda_http::Body> {
        match self {
            Unread::TooLarge => respond(Err(ReceiveError::TooLarge(limit))),
            Unread::Failed => error(StatusCode::BAD_REQUEST, "could not read the request body"),
            Unread::TimedOut => closing(error(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time; nothing was stored",
            )),
        }
    }
}

/// A body of at most `limit` bytes, read within `timeout`, with its share of
/// the bodies in flight (its declared size, else the limit), held until the
/// answer: the body is in memory until then. One declared over the limit is
/// refused before it is read.
async fn read_body<'a>(
    bodies: &'a Semaphore,
    parts: &Parts,
    body: Incoming,
    limit: usize,
    timeout: Duration,
) -> Result<(SemaphorePermit<'a>, Bytes), Unread> {
    let declared = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Unread::TooLarge);
    }
    let kib = (declared.map_or(limit, |n| n as usize).div_ceil(1024)).clamp(1, MAX_BODY_BYTES_IN_FLIGHT / 1024);
    let read = async {
        let share = bodies.acquire_many(kib as u32).await.expect("the semaphore is never closed");
        (share, Limited::new(body, limit).collect().await)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok((share, Ok(collected))) => Ok((share, collected.to_bytes())),
        Ok((_, Err(e))) if e.downcast_ref::<LengthLimitError>().is_some() => Err(Unread::TooLarge),
        Ok((_, Err(e))) => {
            tracing::debug!(error = %e, "reading the body failed");
            Err(Unread::Failed)
        }
        Err(_) => Err(Unread::TimedOut),
    }
}

/// The response, with the connection closed after it.
fn closing<B>(mut r: Response<B>) -> Response<B> {
    r.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    r
}

fn unavailable() -> Response<axum::body::Body> {
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down; nothing was stored, retry later");
    r.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("5"));
    closing(r).map(|b| axum::body::Body::from(b.as_ref().to_vec()))
}

/// The console's share of requests is taken: at once, not queued.
fn busy() -> Response<axum::body::Body> {
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "the console is busy; try again in a moment");
    r.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    r.map(|b| axum::body::Body::from(b.as_ref().to_vec()))
}

async fn handle(
    receiver: &Receiver,
    bodies: &Semaphore,
    req: Request<Incoming>,
    body_timeout: Duration,
    count: Option<fn(&Metrics, Duration)>,
) -> Response<Full<Bytes>> {
    let limit = receiver.max_body_bytes();
    let (parts, body) = req.into_parts();
    let response = match read_body(bodies, &parts, body, limit, body_timeout).await {
        Ok((_share, body)) => {
            let req = Request::from_parts(parts, lambda_http::Body::from(Vec::from(body)));
            match count {
                Some(count) => {
                    let started = std::time::Instant::now();
                    let (response, metrics) = receiver.handle_counted(req).await;
                    count(&metrics, started.elapsed());
                    response
                }
                None => receiver.handle(req).await,
            }
        }
        Err(unread) => unread.response(limit),
    };
    response.map(|b| Full::new(Bytes::copy_from_slice(b.as_ref())))
}

fn error(status: StatusCode, message: &str) -> Response<lambda_http::Body> {
    let mut r = Response::new(lambda_http::Body::from(serde_json::json!({ "error": message }).to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_come_from_the_environment_and_zero_is_refused() {
        let d = Limits::read(&Env::from_pairs(&[])).unwrap();
        assert_eq!((d.header_timeout, d.body_timeout), (Duration::from_secs(10), Duration::from_secs(30)));
        assert_eq!((d.max_connections, d.console_in_flight, d.console_in_flight_per_client), (4096, 64, 16));
        let pairs = [
            ("INBOX_HEADER_TIMEOUT_MS", "2000"),
            ("INBOX_BODY_TIMEOUT_MS", "5000"),
            ("INBOX_MAX_CONNECTIONS", "10000"),
            ("INBOX_CONSOLE_MAX_IN_FLIGHT", "8"),
        ];
        let l = Limits::read(&Env::from_pairs(&pairs)).unwrap();
        assert_eq!((l.header_timeout, l.body_timeout), (Duration::from_secs(2), Duration::from_secs(5)));
        assert_eq!((l.max_connections, l.console_in_flight, l.console_in_flight_per_client), (10_000, 8, 2));
        let zero = [("INBOX_CONSOLE_MAX_IN_FLIGHT", "0")];
        assert!(Limits::read(&Env::from_pairs(&zero)).unwrap_err().to_string().contains("INBOX_CONSOLE_MAX_IN_FLIGHT"));
        assert!(connection_cap(100) <= 100);
    }

    /// A client's first line, and what it reads back (up to the end of the headers).
    async fn ask(from: &str, to: SocketAddr, head: &str) -> tokio::net::TcpStream {
        use tokio::io::AsyncWriteExt as _;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        let mut stream = socket.connect(to).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        stream
    }

    async fn status(stream: &mut tokio::net::TcpStream) -> u16 {
        use tokio::io::AsyncReadExt as _;
        let mut answer = vec![0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer)).await.unwrap().unwrap();
        String::from_utf8_lossy(&answer[..n])[9..12].parse().unwrap()
    }

    /// Slow bodies from one client hold its share of the console's requests,
    /// not the others'; and what the head check refuses from its head alone (an API
    /// call without a token's form) holds nothing, its body never read.
    #[tokio::test]
    async fn one_client_s_slow_bodies_leave_the_other_clients_their_share_and_the_head_check_reads_no_body() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = axum::Router::new().route("/{*path}", axum::routing::any(|| async { "page" }));
        fn check(parts: &Parts) -> Option<Response<axum::body::Body>> {
            let api = parts.uri.path().starts_with("/api/");
            (api && !parts.headers.contains_key(http::header::AUTHORIZATION)).then(|| {
                let mut r = Response::new(axum::body::Body::from("{}"));
                *r.status_mut() = StatusCode::UNAUTHORIZED;
                r
            })
        }
        let site = Site {
            receiver: None,
            router: Some(router),
            routed: |_| true,
            paged: |_| true,
            head_check: Some(check),
            count: None,
            closed: None,
        };
        let limits = Limits { console_in_flight: 8, console_in_flight_per_client: 2, ..Limits::default() };
        tokio::spawn(serve_site(listener, site, limits, std::future::pending(), Duration::ZERO));

        // A stranger: API calls without a token, each promising a body it never sends.
        let slow = "POST /api/v1/erase HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
        for _ in 0..16 {
            assert_eq!(status(&mut ask("127.0.0.3", addr, slow).await).await, 401, "refused from its head");
        }
        // Another: pages, each promising a body it never sends. Two are held, the rest refused at once.
        let slow_page = "POST /signin HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(ask("127.0.0.4", addr, slow_page).await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..8 {
            assert_eq!(status(&mut ask("127.0.0.4", addr, slow_page).await).await, 503, "past its share");
        }
        // The operator, from elsewhere, is served.
        let get = "GET /events HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(status(&mut ask("127.0.0.2", addr, get).await).await, 200);
        drop(held);
    }
}
