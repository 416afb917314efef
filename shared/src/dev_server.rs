//! `inbox dev`'s HTTP server: the very same [`Receiver::handle`] as the Lambda,
//! behind a plain HTTP/1.1 listener.

use std::{convert::Infallible, future::Future, sync::Arc};

use bytes::Bytes;
use http::{header::CONTENT_LENGTH, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::receive::{respond, ReceiveError, Receiver};

/// Serves until `shutdown` completes; each connection on its own task.
pub async fn serve(
    listener: TcpListener,
    receiver: Arc<Receiver>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let _ = stream.set_nodelay(true);
        let receiver = receiver.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let receiver = receiver.clone();
                async move { Ok::<_, Infallible>(handle(&receiver, req).await) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}

async fn handle(receiver: &Receiver, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let limit = receiver.max_body_bytes();
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    // A body over the limit is refused before it is read, let alone hashed.
    let response = if declared.is_some_and(|n| n > limit as u64) {
        respond(Err(ReceiveError::TooLarge(limit)))
    } else {
        match Limited::new(body, limit).collect().await {
            Ok(collected) => {
                let body = lambda_http::Body::from(Vec::from(collected.to_bytes()));
                receiver.handle(Request::from_parts(parts, body)).await
            }
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                respond(Err(ReceiveError::TooLarge(limit)))
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading the body failed");
                let mut r = Response::new(lambda_http::Body::from(
                    r#"{"error":"could not read the request body"}"#,
                ));
                *r.status_mut() = StatusCode::BAD_REQUEST;
                r
            }
        }
    };
    response.map(|b| Full::new(Bytes::copy_from_slice(b.as_ref())))
}
