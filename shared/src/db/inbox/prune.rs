//! Retention's deletes.

use sqlx::PgExecutor;

use crate::{core::status::Status, db};

/// Which providers' rows a retention DELETE takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Providers<'a> {
    Any,
    Only(&'a [&'a str]),
    Except(&'a [&'a str]),
}

impl<'a> Providers<'a> {
    pub(super) fn binds(self) -> (Option<&'a [&'a str]>, &'a [&'a str]) {
        match self {
            Providers::Any => (None, &[]),
            Providers::Only(p) => (Some(p), &[]),
            Providers::Except(p) => (None, p),
        }
    }
}

/// The rows past retention: `$1` only these providers (NULL: any), `$2` the
/// statuses, `$3` days, `$4` the limit, `$5` not these providers. A restored
/// row is kept its retention from when it was restored too.
macro_rules! due {
    () => {
        "received_at < now() - make_interval(days => $3)
         AND (restored_at IS NULL OR restored_at < now() - make_interval(days => $3))
         AND status = ANY($2)
         AND ($1::text[] IS NULL OR provider = ANY($1))
         AND NOT provider = ANY($5::text[])
         LIMIT $4
         FOR UPDATE SKIP LOCKED"
    };
}
#[cfg(feature = "archive")]
pub(super) use due;

/// Binds [`due!`]'s parameters, in its order.
macro_rules! bind_due {
    ($query:expr, $providers:expr, $statuses:expr, $days:expr, $limit:expr) => {{
        let (only, except) = $providers.binds();
        $query
            .bind(only)
            .bind($statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>())
            .bind($days as i32)
            .bind($limit)
            .bind(except)
    }};
}
#[cfg(feature = "archive")]
pub(super) use bind_due;

/// Deletes up to `limit` rows of one of `statuses` (of `providers`) received
/// before `days` ago, skipping rows another transaction holds.
pub(crate) async fn delete_received_before<'e>(
    ex: impl PgExecutor<'e>,
    providers: Providers<'_>,
    statuses: &[Status],
    days: u32,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let done = bind_due!(
        db::query(concat!(
            "DELETE FROM webhook_inbox AS w
         USING (SELECT provider, event_id FROM webhook_inbox WHERE ",
            due!(),
            ") AS old
         WHERE w.provider = old.provider AND w.event_id = old.event_id"
        )),
        providers,
        statuses,
        days,
        limit
    )
    .execute(ex)
    .await?;
    Ok(done.rows_affected())
}
