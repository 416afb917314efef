//! The outbound HTTP client (sinks, provider APIs) and the `Retry-After` a peer answers with.

use std::time::Duration;

/// An HTTP client for outbound calls (sinks, provider APIs), TLS by rustls with ring.
/// Redirects are not followed: a POST turned into a GET would count as
/// delivered, and a token header could be carried to another host.
pub fn http_client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    // reqwest is built without a default crypto provider; ring is ours.
    let _ = rustls::crypto::ring::default_provider().install_default();
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
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Why an answer was not read.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// Longer than the limit (said by `Content-Length`, or found reading it).
    #[error("the answer is over {} MiB: not read", .0 / (1024 * 1024))]
    TooLarge(usize),
    /// The connection failed while it was read (the error without the URL, which may carry a key).
    #[error("reading the answer failed: {0}")]
    Failed(reqwest::Error),
}

/// An answer's body as text (invalid UTF-8 replaced), read up to `limit` bytes.
pub async fn text(mut response: reqwest::Response, limit: usize) -> Result<String, AnswerError> {
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
pub async fn head(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
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
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    super::backoff::retry_after_value(headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer streamed without a length, chunk after chunk, for ever: read up to the limit only.
    #[tokio::test]
    async fn an_answer_without_a_length_is_read_up_to_the_limit_only() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut peer, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut peer, &mut request).await;
            peer.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").await.unwrap();
            let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "x".repeat(64 * 1024));
            while peer.write_all(chunk.as_bytes()).await.is_ok() {}
        });
        let response =
            http_client(Duration::from_secs(10)).unwrap().get(format!("http://{addr}/")).send().await.unwrap();
        assert!(response.content_length().is_none());
        assert!(matches!(text(response, 1 << 20).await, Err(AnswerError::TooLarge(_))));
    }
    use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

    fn after(v: &str) -> Option<Duration> {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(v).unwrap());
        retry_after(&h)
    }

    #[test]
    fn retry_after_reads_seconds_decimals_and_dates_and_is_capped() {
        assert_eq!(after("30"), Some(Duration::from_secs(30)));
        assert_eq!(after("2.5"), Some(Duration::from_millis(2500)));
        assert_eq!(after("99999999999"), Some(crate::core::backoff::RETRY_CAP));
        assert_eq!(after("-1"), None);
        let in_a_minute = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(61));
        let d = after(&in_a_minute).unwrap();
        assert!((Duration::from_secs(59)..=Duration::from_secs(61)).contains(&d), "{d:?}");
        assert_eq!(after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO), "a past date: now");
        assert_eq!(after("soon"), None);
    }
}
