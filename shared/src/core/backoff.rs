//! Waiting before another try: exponential backoff with jitter, and the
//! `Retry-After` a peer may ask for, both capped at an hour.

use std::time::Duration;

/// Longest wait between two attempts of one event or message.
pub(crate) const RETRY_CAP: Duration = Duration::from_secs(3600);

/// Exponential backoff with jitter, capped at an hour: `base` doubled per
/// attempt already made, half of it fixed and half random.
pub(crate) fn backoff(base: Duration, attempts_before: i32) -> Duration {
    let exp = 2u32.saturating_pow(attempts_before.clamp(0, 31) as u32);
    let full = base.saturating_mul(exp).min(RETRY_CAP).as_millis() as u64;
    Duration::from_millis(full / 2 + jitter(full / 2))
}

/// A random number in `0..=max`, from the standard library's per-process random keys.
pub(crate) fn jitter(max: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(max);
    h.finish() % (max + 1)
}

/// `Retry-After` (seconds, whole or decimal, or an HTTP date), at most [`RETRY_CAP`].
#[cfg(feature = "http-client")]
pub(crate) fn retry_after_value(value: &str) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Duration::from_secs_f64(secs.min(RETRY_CAP.as_secs_f64())),
        Ok(_) => return None,
        Err(_) => {
            httpdate::parse_http_date(value).ok()?.duration_since(std::time::SystemTime::now()).unwrap_or_default()
        }
    };
    Some(wait.min(RETRY_CAP))
}
