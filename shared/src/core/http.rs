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

/// `Retry-After` as seconds (whole or decimal) or an HTTP date, at most an hour.
#[cfg(any(feature = "relay", feature = "reconcile"))]
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    super::backoff::retry_after_value(headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
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
