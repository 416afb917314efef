//! The claim: what a verified delivery carried goes into `webhook_inbox`
//! exactly once (the statements are in [`crate::db::inbox`]), with the retries
//! and the fallbacks that make every signed delivery a row.

use sqlx::{PgConnection, PgExecutor};
use webhook_inbox_schemes::text::Escaped;

pub(crate) mod inline;

pub(crate) use crate::db::inbox::{Claim, Envelope};
use crate::db::{
    self,
    inbox::{insert, insert_batch, Body},
};
use webhook_inbox_schemes::{Events, NewEvent};

/// A batch's result: rows inserted, and items already known (before or inside the batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchClaim {
    pub accepted: usize,
    pub duplicates: usize,
}

/// Claims one event in a single statement (its own short transaction).
pub(crate) async fn claim<'e>(ex: impl PgExecutor<'e>, env: &Envelope<'_>, e: &NewEvent) -> Result<Claim, sqlx::Error> {
    insert(ex, env, e, Body::InRow).await
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claimed {
    Single(Claim),
    Batch(BatchClaim),
    /// Inline mode, exclusive handler: another delivery of the event holds its lock. Nothing stored.
    Busy,
}

/// Claims a batch in one `unnest` statement, its raw bytes stored once (see
/// `webhook_bodies`), whatever the number of items. Keys are sorted (concurrent batches
/// lock in the same order, so they cannot deadlock) and repeats inside the batch
/// are collapsed to their first occurrence; only the new rows come back.
pub(crate) async fn claim_batch<'e>(
    ex: impl PgExecutor<'e>,
    env: &Envelope<'_>,
    events: &[NewEvent],
) -> Result<BatchClaim, sqlx::Error> {
    let accepted = claim_batch_new_ids(ex, env, events).await?.len();
    Ok(BatchClaim { accepted, duplicates: events.len() - accepted })
}

/// [`claim_batch`], returning the ids of the rows it inserted.
pub(crate) async fn claim_batch_new_ids<'e>(
    ex: impl PgExecutor<'e>,
    env: &Envelope<'_>,
    events: &[NewEvent],
) -> Result<Vec<String>, sqlx::Error> {
    let unique = sorted_unique(events);
    if unique.is_empty() {
        return Ok(vec![]);
    }
    insert_batch(ex, env, &unique).await
}

pub(crate) fn sorted_unique(events: &[NewEvent]) -> Vec<&NewEvent> {
    let mut v: Vec<&NewEvent> = events.iter().collect();
    v.sort_by(|a, b| a.event_id.as_bytes().cmp(b.event_id.as_bytes()));
    v.dedup_by(|b, a| a.event_id == b.event_id); // stable sort: the first occurrence stays
    v
}

/// Awaits `$call` again, on the same connection, while [`db::retry_after`] says so.
macro_rules! retrying {
    ($call:expr) => {{
        let mut attempt = 1;
        loop {
            match $call.await {
                Err(err) => match db::retry_after(&err, attempt) {
                    Some(wait) => {
                        tokio::time::sleep(wait).await;
                        attempt += 1;
                    }
                    None => break Err(err),
                },
                ok => break ok,
            }
        }
    }};
}

pub(crate) mod group;

/// Claims what a delivery carried, retrying the whole claim on 40001/40P01, and
/// once on a connection that turns out to be dead (the claim is idempotent, so
/// running it again after an unknown outcome answers `duplicate`, never twice).
///
/// If PostgreSQL refuses a payload that passed our JSON checks (whatever the
/// SQLSTATE, so long as it is not an outage), the event is stored anyway, as
/// `failed` with the raw bytes and no payload: a signed delivery is never lost.
/// If that fallback fails too, the database is the problem, and the error stands (503).
///
/// With `inline` handlers (inline mode), the new events' handlers run inside the
/// claim's transaction (see the `inline` module).
pub(crate) async fn claim_delivery(
    connections: &db::Connections,
    env: &Envelope<'_>,
    events: &Events,
    inline: Option<&dyn inline::InlineHandlers>,
) -> Result<Claimed, sqlx::Error> {
    match claim_on_a_lease(connections, env, events, inline).await {
        Err(e) if db::is_connection_lost(&e) => {
            connections.discard_idle();
            tracing::warn!(error = %e, "connection lost during the claim; claiming again on a fresh one");
            claim_on_a_lease(connections, env, events, inline).await
        }
        other => other,
    }
}

/// One event on one of `connections` (the single claim, with its fallback),
/// claimed again on a fresh connection if the first turns out to be dead.
pub(crate) async fn claim_single(
    connections: &db::Connections,
    env: &Envelope<'_>,
    e: &NewEvent,
) -> Result<Claim, sqlx::Error> {
    let on_a_lease = || async {
        let mut conn = connections.acquire().await?;
        let result = claim_one(&mut conn, env, e).await;
        if matches!(result, Ok(_) | Err(sqlx::Error::Database(_))) {
            conn.reuse();
        }
        result
    };
    match on_a_lease().await {
        Err(err) if db::is_connection_lost(&err) => {
            connections.discard_idle();
            tracing::warn!(error = %err, "connection lost during the claim; claiming again on a fresh one");
            on_a_lease().await
        }
        other => other,
    }
}

async fn claim_on_a_lease(
    connections: &db::Connections,
    env: &Envelope<'_>,
    events: &Events,
    inline: Option<&dyn inline::InlineHandlers>,
) -> Result<Claimed, sqlx::Error> {
    let mut conn = connections.acquire().await?;
    let result = match inline {
        Some(handlers) => {
            match retrying!(inline::claim_and_apply(&mut conn, env, events, handlers)) {
                // A payload PostgreSQL refuses: stored by the plain claim's fallback, for the worker to see.
                Err(e) if db::is_refused_value(&e) => claim_events(&mut conn, env, events).await,
                other => other,
            }
        }
        None => claim_events(&mut conn, env, events).await,
    };
    // After any other error (protocol, decoding, ...) the connection's state is unknown: it is closed.
    if matches!(result, Ok(_) | Err(sqlx::Error::Database(_))) {
        conn.reuse();
    }
    result
}

async fn claim_events(conn: &mut PgConnection, env: &Envelope<'_>, events: &Events) -> Result<Claimed, sqlx::Error> {
    match events {
        Events::Single(e) => claim_one(conn, env, e).await.map(Claimed::Single),
        Events::Batch(items) => match retrying!(claim_batch(db::Autocommit(&mut *conn), env, items)) {
            Err(err) if db::is_refused_value(&err) => {
                let mut out = BatchClaim { accepted: 0, duplicates: items.len() - sorted_unique(items).len() };
                for e in sorted_unique(items) {
                    match claim_one_as(conn, env, e, Body::Shared).await? {
                        Claim::New => out.accepted += 1,
                        Claim::Duplicate | Claim::Replay => out.duplicates += 1,
                    }
                }
                Ok(Claimed::Batch(out))
            }
            other => other.map(Claimed::Batch),
        },
    }
}

/// One event in its own statement, with the fallback: if PostgreSQL refuses its
/// payload, the event is kept as `failed` without it. Receive and reconcile share it.
pub(crate) async fn claim_one(conn: &mut PgConnection, env: &Envelope<'_>, e: &NewEvent) -> Result<Claim, sqlx::Error> {
    claim_one_as(conn, env, e, Body::InRow).await
}

async fn claim_one_as(
    conn: &mut PgConnection,
    env: &Envelope<'_>,
    e: &NewEvent,
    body: Body,
) -> Result<Claim, sqlx::Error> {
    match retrying!(insert(db::Autocommit(&mut *conn), env, e, body)) {
        Err(err) if e.payload.is_some() && db::is_refused_value(&err) => {
            let reason = format!(
                "PostgreSQL refused the payload as jsonb (SQLSTATE {})",
                db::sqlstate(&err).unwrap_or_default()
            );
            tracing::warn!(provider = %env.provider, event_id = %Escaped(&e.event_id), reason = %Escaped(&reason), "storing the event as failed, without its payload");
            let fallback = NewEvent::unusable(e.event_id.clone(), &e.event_type, None, reason);
            retrying!(insert(db::Autocommit(&mut *conn), env, &fallback, body))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests;
