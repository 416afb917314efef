//! Inline mode (`INBOX_INLINE_PROVIDERS`): receive runs the handler inside the
//! claim's transaction (docs/webhook-inbox-article.txt, section 2), so the effect is visible when the
//! sender gets its 200. A failing handler never loses the event: its savepoint
//! rolls back, the claim commits as `pending`, and the worker retries it.
//!
//! A handler that is `exclusive()` (heavy work) takes the event's advisory lock
//! before the claim, so a concurrent duplicate delivery is told to come back
//! (503) instead of queueing behind it on the primary key.
//!
//! Receive knows handlers through [`InlineHandlers`] only: the process stage
//! implements it over its handlers and ignore rules.

use futures_util::future::BoxFuture;
use sqlx::{Acquire, PgConnection};
use webhook_inbox_schemes::text::Escaped;

use crate::{
    db::{self, inbox as table},
    receive::claim::{self, BatchClaim, Claim, Claimed, Envelope},
};
use webhook_inbox_schemes::{Events, InitialStatus, NewEvent, Provider};

/// What inline receive asks of the stage that runs handlers (`process`
/// implements it), so that receive depends on this and not on that stage.
pub(crate) trait InlineHandlers: Send + Sync {
    /// Whether a handler takes events of this type: `Some(exclusive)`, where an
    /// exclusive one runs alone (the event's advisory lock, taken before the claim).
    fn handles(&self, provider: Provider, event_type: &str) -> Option<bool>;

    /// Runs a new event's handler on `tx`, in a savepoint of its own: committed
    /// when it applied, rolled back when it failed. The error is the
    /// connection's, lost: the claim is retried on another.
    fn apply<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        env: &'a Envelope<'a>,
        event: &'a NewEvent,
    ) -> BoxFuture<'a, Result<Applied, sqlx::Error>>;
}

/// What [`InlineHandlers::apply`] did with an event.
#[derive(Debug)]
pub(crate) enum Applied {
    /// Its handler applied it: the event is done.
    Done,
    /// Left pending for the worker, untouched (an ignore rule takes it, or its
    /// handler's object is fetched by the worker, never inside this transaction).
    Left,
    /// Its payload does not decode as the handler's type: failed, as the worker would fail it.
    Unusable(String),
    /// Its handler failed: left pending for the worker, with this reason.
    Failed(String),
}

pub(crate) async fn claim_and_apply(
    conn: &mut PgConnection,
    env: &Envelope<'_>,
    events: &Events,
    handlers: &dyn InlineHandlers,
) -> Result<Claimed, sqlx::Error> {
    let mut tx = conn.begin().await?;
    if let Events::Single(e) = events {
        let exclusive = handlers.handles(env.provider, &e.event_type) == Some(true);
        if exclusive && !table::try_lock_event(&mut tx, env.provider, &e.event_id).await? {
            // Another delivery of this very event is inside its handler: skip, don't queue.
            tx.rollback().await?;
            return Ok(Claimed::Busy);
        }
    }
    let (claimed, new): (Claimed, Vec<&NewEvent>) = match events {
        Events::Single(e) => {
            let claim = claim::claim(&mut *tx, env, e).await?;
            (Claimed::Single(claim), if claim == Claim::New { vec![e] } else { vec![] })
        }
        Events::Batch(items) => {
            let ids = claim::claim_batch_new_ids(&mut *tx, env, items).await?;
            let new: Vec<&NewEvent> =
                claim::sorted_unique(items).into_iter().filter(|e| ids.contains(&e.event_id)).collect();
            (Claimed::Batch(BatchClaim { accepted: new.len(), duplicates: items.len() - new.len() }), new)
        }
    };
    let new: Vec<&NewEvent> = new.into_iter().filter(|e| e.status == InitialStatus::Pending).collect();
    // Paused types (`inbox pause`), read under the pauses' gate once an event may run here.
    let paused = match new.iter().any(|e| handlers.handles(env.provider, &e.event_type).is_some()) {
        true => db::pauses::paused_types(&mut tx, env.provider.as_str()).await?,
        false => Vec::new(),
    };
    for e in new {
        // Types with no handler, and paused ones, stay pending: the worker
        // marks them unhandled or holds them, and counts them.
        if handlers.handles(env.provider, &e.event_type).is_none()
            || paused.iter().any(|t| t.as_deref().map_or(true, |t| t == e.event_type))
        {
            continue;
        }
        match handlers.apply(&mut tx, env, e).await? {
            Applied::Done => table::mark_done_inline(&mut tx, env.provider, &e.event_id).await?,
            Applied::Left => {}
            Applied::Unusable(why) => table::mark_unusable(&mut tx, env.provider, &e.event_id, &why).await?,
            Applied::Failed(why) => {
                tracing::info!(provider = %env.provider, event_id = %Escaped(&e.event_id), error = %Escaped(&why), "inline handler failed; left pending for the worker");
                table::note_inline_failure(&mut tx, env.provider, &e.event_id, &format!("attempt 1 (inline): {why}"))
                    .await?;
            }
        }
    }
    tx.commit().await?;
    Ok(claimed)
}
