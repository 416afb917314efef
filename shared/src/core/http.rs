//! The outbound HTTP client (sinks, provider APIs) and the `Retry-After` a peer answers with.

use std::time::Duration;

/// An HTTP client for outbound calls (sinks, provider APIs), TLS by rustls with ring.
/// Redirects are not followed: a POST turned into a GET would count as
/// delivered, and a token header could be carried to another host.
// Public as `sinks::http_client`, with the relay.
#[cfg_attr(not(feature = "relay"), allow(unreachable_pub))]
pub fn http_client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    // reqwest is built without a default crypto provider; ring is ours: it
    // cross-compiles for the arm64 functions without a C toolchain. rustls
    // 0.23.48 deprecates ring's provider (it has no post-quantum key exchange);
    // it is allowed here so that a team's build resolving that release, with
    // `-D warnings`, stays clean. Cargo.lock holds 0.23.48: the test command's
    // `-D warnings` build fails without this line.
    #[allow(deprecated)]
    let provider = rustls::crypto::ring::default_provider();
    let _ = provider.install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .user_agent("webhook-inbox")
        .build()
}

/// The largest answer read from a provider's API, in bytes: a page of
/// Stripe's events or Shopify's orders, one GitHub delivery or one Stripe
/// object is at most a few MiB; an answer without end would take the memory.
pub(crate) const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Why an answer was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AnswerError {
    /// Longer than the limit (said by `Content-Length`, or found reading it).
    #[error("the answer is over {} MiB: not read", .0 / (1024 * 1024))]
    TooLarge(usize),
    /// The connection failed while it was read (the error without the URL, which may carry a key).
    #[error("reading the answer failed: {0}")]
    Failed(reqwest::Error),
}

/// An answer's body as text (invalid UTF-8 replaced), read up to `limit` bytes.
pub(crate) async fn text(mut response: reqwest::Response, limit: usize) -> Result<String, AnswerError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(AnswerError::TooLarge(limit));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| AnswerError::Failed(e.without_url()))? {
        if body.len() + chunk.len() > limit {
            return Err(AnswerError::TooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(match String::from_utf8(body) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// The first `limit` bytes of an answer's body (fewer if it is shorter), and
/// nothing more read: the rest is left unread and the connection dropped, so
/// that a peer answering with a body without end costs `limit` bytes and a
/// chunk. A read that fails keeps what came before it.
#[cfg(feature = "relay")]
pub(crate) async fn head(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(limit.min(8 * 1024));
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(limit - body.len())]),
            Ok(None) | Err(_) => break,
        }
    }
    body
}

/// `Retry-After` as seconds (whole or decimal) or an HTTP date, at most an hour.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    super::backoff::retry_after_value(headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An answer streamed without a length, chunk after chunk: read up to the limit only.
    #[tokio::test]
    async fn an_answer_without_a_length_is_read_up_to_the_limit_only() {
        let peer = endless("200 OK").await;
        let response =
            http_client(Duration::from_secs(10)).unwrap().get(format!("http://{}/", peer.addr)).send().await.unwrap();
        assert!(response.content_length().is_none());
        assert!(matches!(text(response, 1 << 20).await, Err(AnswerError::TooLarge(_))));
    }

    /// A peer answering one request with `status` and a body of 1 GiB,
    /// streamed without a length until the reader goes away.
    #[cfg_attr(not(feature = "relay"), allow(dead_code))] // the relay's tests read them too
    pub(crate) struct Endless {
        pub(crate) addr: std::net::SocketAddr,
        /// The body's bytes written so far.
        pub(crate) written: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        /// Sent once it stopped writing.
        pub(crate) ended: tokio::sync::oneshot::Receiver<()>,
    }

    pub(crate) async fn endless(status: &str) -> Endless {
        use std::sync::{atomic::Ordering, Arc};
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (count, (done, ended)) = (written.clone(), tokio::sync::oneshot::channel());
        let head = format!("HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n");
        tokio::spawn(async move {
            let (mut peer, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut peer, &mut request).await;
            peer.write_all(head.as_bytes()).await.unwrap();
            let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "x".repeat(64 * 1024));
            for _ in 0..16 * 1024 {
                if peer.write_all(chunk.as_bytes()).await.is_err() {
                    break; // the reader went away
                }
                count.fetch_add(chunk.len(), Ordering::Relaxed);
            }
            let _ = done.send(());
        });
        Endless { addr, written, ended }
    }
}
