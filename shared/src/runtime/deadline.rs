//! The Lambda deadline, as every scheduled function uses it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `INBOX_DEADLINE_MARGIN_MS`, default 7000: a scheduled drain stops starting
/// batches this long before the Lambda deadline (the statement timeout, 5000,
/// plus time to commit and answer).
pub(crate) const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_millis(7000);

/// The Lambda deadline (milliseconds since the epoch) less the margin, as an `Instant`.
pub(crate) fn drain_until(deadline_epoch_ms: u64, margin: Duration) -> Instant {
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    Instant::now() + Duration::from_millis(deadline_epoch_ms.saturating_sub(now_ms)).saturating_sub(margin)
}
