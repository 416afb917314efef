//! The long-running servers' HTTP listener (`inbox serve`, `inbox dev`): the
//! very same [`Receiver::handle`] as the Lambda at `/webhooks/{provider}`
//! behind a plain HTTP/1.1 listener, and the other routes (the console, the
//! health checks) from an axum router. On shutdown it stops accepting, lets
//! every request in flight finish (a delivery is answered once its claim has
//! committed), closes idle connections, and past its drain timeout answers
//! what is left 503.

use std::{convert::Infallible, future::Future, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{header::CONTENT_LENGTH, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};
use tower::ServiceExt as _;

use crate::ingest::receive::{respond, ReceiveError, Receiver};

/// How long a client may take: to send each request's headers (an idle
/// keep-alive connection included), then its body. A client that dawdles is
/// cut off, so slow clients cannot hold connections forever.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub header: Duration,
    pub body: Duration,
}

/// Connections served at once; past it, new ones wait in the listener's
/// backlog rather than take a descriptor each.
pub const MAX_CONNECTIONS: usize = 1024;

/// Request bodies read at once, in bytes: each in full before it is verified,
/// so this bounds what slow bodies can hold (the rest wait their turn, within
/// their body timeout), whatever the number of connections.
pub const MAX_BODY_BYTES_IN_FLIGHT: usize = 64 * 1024 * 1024;

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { header: Duration::from_secs(10), body: Duration::from_secs(30) }
    }
}

/// Where the console is served beside the webhooks.
pub const CONSOLE_PATH: &str = "/console";

/// What a listener serves.
#[derive(Clone)]
pub struct Site {
    /// `POST /webhooks/{provider}` (any path the router does not take); without
    /// it, such a path is answered 404.
    pub receiver: Option<Arc<Receiver>>,
    /// The paths [`Site::routed`] names: the console at [`CONSOLE_PATH`], `/healthz`, `/readyz`, `/metrics`.
    pub router: Option<axum::Router>,
    /// What the router takes.
    pub routed: fn(&str) -> bool,
    /// Each delivery counted in the Prometheus metrics (`inbox serve`).
    pub counted: bool,
}

#[cfg(feature = "internals")]
impl Site {
    /// Webhooks only.
    pub fn webhooks(receiver: Arc<Receiver>) -> Self {
        Site { receiver: Some(receiver), router: None, routed: |_| false, counted: false }
    }
}

/// The console's paths, and the health checks (`/healthz`, `/readyz`).
pub fn console_or_health(path: &str) -> bool {
    path == CONSOLE_PATH || path.starts_with("/console/") || matches!(path, "/healthz" | "/readyz")
}

/// Serves until `shutdown` completes; each connection on its own task.
#[cfg(feature = "internals")]
pub async fn serve(
    listener: TcpListener,
    receiver: Arc<Receiver>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, receiver, Timeouts::default(), shutdown).await
}

/// [`serve`] with other [`Timeouts`].
#[cfg(feature = "internals")]
pub async fn serve_with(
    listener: TcpListener,
    receiver: Arc<Receiver>,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_site(listener, Site::webhooks(receiver), timeouts, shutdown, Duration::from_secs(10)).await;
    Ok(())
}

/// Serves `site` until `shutdown` completes, then drains: no new connection,
/// each request in flight finished and each idle connection closed, within
/// `drain`; past it, the requests still in flight are answered 503 (the
/// provider sends again; nothing it was told of is lost). Returns how many
/// requests were answered 503 at the end of the drain.
pub async fn serve_site(
    listener: TcpListener,
    site: Site,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> usize {
    tokio::pin!(shutdown);
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let bodies = Arc::new(Semaphore::new(MAX_BODY_BYTES_IN_FLIGHT / 1024));
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
        let (site, bodies, mut drained, given_up, cut) =
            (site.clone(), bodies.clone(), drained.clone(), given_up.clone(), cut.clone());
        tokio::spawn(async move {
            let _slot = slot; // given back when the connection ends
            let service = service_fn(move |req: Request<Incoming>| {
                let (site, bodies, mut given_up, cut) = (site.clone(), bodies.clone(), given_up.clone(), cut.clone());
                async move {
                    let answer = route(&site, &bodies, req, peer, timeouts.body);
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
                .header_read_timeout(timeouts.header)
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
    let _ = draining.send(true);
    // Every connection gives its slot back when it ends.
    let all = MAX_CONNECTIONS as u32;
    if tokio::time::timeout(drain, connections.acquire_many(all)).await.is_err() {
        let _ = give_up.send(true);
        // The 503s written, the connections closed (a stuck client is left to its timeouts).
        let _ = tokio::time::timeout(Duration::from_secs(1), connections.acquire_many(all)).await;
    }
    cut.load(std::sync::atomic::Ordering::Relaxed)
}

/// The router's paths to the router, the rest to the receiver.
async fn route(
    site: &Site,
    bodies: &Semaphore,
    mut req: Request<Incoming>,
    peer: SocketAddr,
    body_timeout: Duration,
) -> Response<axum::body::Body> {
    match site.router.clone().filter(|_| (site.routed)(req.uri().path())) {
        Some(router) => {
            req.extensions_mut().insert(axum::extract::ConnectInfo::<SocketAddr>(peer));
            router.oneshot(req).await.unwrap_or_else(|never| match never {})
        }
        None => match &site.receiver {
            Some(receiver) => handle(receiver, bodies, req, body_timeout, site.counted).await.map(axum::body::Body::new),
            None => respond(Err(ReceiveError::NoRoute)).map(|b| axum::body::Body::from(b.as_ref().to_vec())),
        },
    }
}

fn unavailable() -> Response<axum::body::Body> {
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down; nothing was stored, retry later");
    r.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    r.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("5"));
    r.map(|b| axum::body::Body::from(b.as_ref().to_vec()))
}

async fn handle(
    receiver: &Receiver,
    bodies: &Semaphore,
    req: Request<Incoming>,
    body_timeout: Duration,
    counted: bool,
) -> Response<Full<Bytes>> {
    let limit = receiver.max_body_bytes();
    let (parts, body) = req.into_parts();
    let declared = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    // A body over the limit is refused before it is read, let alone hashed.
    let response = if declared.is_some_and(|n| n > limit as u64) {
        respond(Err(ReceiveError::TooLarge(limit)))
    } else {
        // Its share of the bodies in flight (its declared size, else the limit), then the body itself.
        let kib = (declared.map_or(limit, |n| n as usize).div_ceil(1024)).clamp(1, MAX_BODY_BYTES_IN_FLIGHT / 1024);
        let read = async {
            let share = bodies.acquire_many(kib as u32).await.expect("the semaphore is never closed");
            (share, Limited::new(body, limit).collect().await)
        };
        match tokio::time::timeout(body_timeout, read).await {
            // The share is held until the answer: the body is in memory until then.
            Ok((_share, Ok(collected))) => {
                let body = lambda_http::Body::from(Vec::from(collected.to_bytes()));
                let req = Request::from_parts(parts, body);
                if counted {
                    let started = std::time::Instant::now();
                    let (response, metrics) = receiver.handle_counted(req).await;
                    super::metrics::delivered(&metrics, started.elapsed());
                    response
                } else {
                    receiver.handle(req).await
                }
            }
            Ok((_, Err(e))) if e.downcast_ref::<LengthLimitError>().is_some() => {
                respond(Err(ReceiveError::TooLarge(limit)))
            }
            Ok((_, Err(e))) => {
                tracing::debug!(error = %e, "reading the body failed");
                error(StatusCode::BAD_REQUEST, "could not read the request body")
            }
            Err(_) => {
                let mut r =
                    error(StatusCode::REQUEST_TIMEOUT, "the request body did not arrive in time; nothing was stored");
                r.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
                r
            }
        }
    };
    response.map(|b| Full::new(Bytes::copy_from_slice(b.as_ref())))
}

fn error(status: StatusCode, message: &str) -> Response<lambda_http::Body> {
    let mut r = Response::new(lambda_http::Body::from(serde_json::json!({ "error": message }).to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}
