//! `inbox dev`'s HTTP server: the very same [`Receiver::handle`] as the Lambda,
//! behind a plain HTTP/1.1 listener, and the console at `/console`.

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
    serve_site(listener, receiver, None, timeouts, shutdown).await
}

/// Where the console is served beside the webhooks.
pub const CONSOLE_PATH: &str = "/console";

/// [`serve_with`], and `console` (the console's pages, at [`CONSOLE_PATH`]) when given.
pub async fn serve_site(
    listener: TcpListener,
    receiver: Arc<Receiver>,
    console: Option<axum::Router>,
    timeouts: Timeouts,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let bodies = Arc::new(Semaphore::new(MAX_BODY_BYTES_IN_FLIGHT / 1024));
    let mut backoff = Duration::ZERO;
    loop {
        let slot = tokio::select! {
            slot = connections.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => return Ok(()),
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
                        () = &mut shutdown => return Ok(()),
                    }
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let _ = stream.set_nodelay(true);
        let (receiver, bodies, console) = (receiver.clone(), bodies.clone(), console.clone());
        tokio::spawn(async move {
            let _slot = slot; // given back when the connection ends
            let service = service_fn(move |mut req: Request<Incoming>| {
                let (receiver, bodies, console) = (receiver.clone(), bodies.clone(), console.clone());
                async move {
                    let path = req.uri().path();
                    let to_console = path == CONSOLE_PATH || path.starts_with(&format!("{CONSOLE_PATH}/"));
                    match console.filter(|_| to_console) {
                        Some(console) => {
                            req.extensions_mut().insert(axum::extract::ConnectInfo::<SocketAddr>(peer));
                            let response = console.oneshot(req).await;
                            Ok::<_, Infallible>(response.unwrap_or_else(|never| match never {}))
                        }
                        None => Ok(handle(&receiver, &bodies, req, timeouts.body).await.map(axum::body::Body::new)),
                    }
                }
            });
            if let Err(e) = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeouts.header)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}

async fn handle(
    receiver: &Receiver,
    bodies: &Semaphore,
    req: Request<Incoming>,
    body_timeout: Duration,
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
                receiver.handle(Request::from_parts(parts, body)).await
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
