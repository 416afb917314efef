//! The Lambda deadline, as every scheduled function uses it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `INBOX_DEADLINE_MARGIN_MS`, default 3000: a scheduled drain stops starting
/// batches this long before the Lambda deadline.
pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_millis(3000);

/// The Lambda deadline (milliseconds since the epoch) less the margin, as an `Instant`.
pub fn drain_until(deadline_epoch_ms: u64, margin: Duration) -> Instant {
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    Instant::now() + Duration::from_millis(deadline_epoch_ms.saturating_sub(now_ms)).saturating_sub(margin)
}
