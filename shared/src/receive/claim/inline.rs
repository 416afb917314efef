//! Inline mode (`INBOX_INLINE_PROVIDERS`): receive runs the handler inside the
//! claim's transaction (docs/webhook-inbox-article.txt, section 2), so the effect is visible when the
//! sender gets its 200. A failing handler never loses the event: its savepoint
//! rolls back, the claim commits as `pending`, and the worker retries it.
//!
//! A handler that is `exclusive()` (heavy work) takes the event's advisory lock
//! before the claim, so a concurrent duplicate delivery is told to come back
//! (503) instead of queueing behind it on the primary key.

use std::time::SystemTime;
use webhook_inbox_schemes::text::Escaped;

use sqlx::{Acquire, PgConnection};

use crate::{
    db::{self, inbox as table},
    process::{
        handler::{HandlerError, Headers},
        handlers::{erased::RawEvent, try_lock_event, Handlers},
        rules::IgnoreRules,
    },
    receive::claim::{self, BatchClaim, Claim, Claimed, Envelope},
};
use webhook_inbox_schemes::{Events, InitialStatus, NewEvent};

pub(crate) async fn claim_and_apply(
    conn: &mut PgConnection,
    env: &Envelope<'_>,
    events: &Events,
    handlers: &Handlers,
    rules: &IgnoreRules,
) -> Result<Claimed, sqlx::Error> {
    let mut tx = conn.begin().await?;
    if let Events::Single(e) = events {
        let exclusive = handlers.get(env.provider, &e.event_type).is_some_and(|h| h.exclusive());
        if exclusive && !try_lock_event(&mut tx, env.provider, &e.event_id).await? {
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
    let paused = match new.iter().any(|e| handlers.get(env.provider, &e.event_type).is_some()) {
        true => db::pauses::paused_types(&mut tx, env.provider.as_str()).await?,
        false => Vec::new(),
    };
    for e in new {
        // Types with no handler, events a rule ignores, and paused ones stay
        // pending: the worker marks them unhandled, ignored or held, and counts them.
        let Some(handler) = handlers.get(env.provider, &e.event_type) else {
            continue;
        };
        if rules.ignoring(env.provider, &e.event_type, e.payload.as_deref()).is_some()
            || paused.iter().any(|t| t.as_deref().map_or(true, |t| t == e.event_type))
        {
            continue;
        }
        let event = RawEvent {
            provider: env.provider,
            event_id: e.event_id.clone(),
            event_type: e.event_type.clone(),
            payload: e.payload.clone(),
            attempts: 0,
            received_at: SystemTime::now(),
            headers: Headers::from_json(env.headers),
            trace_context: env.trace_context.map(str::to_string),
            // Inline mode's messages wait for the relay's next pass.
            written: None,
        };
        // A payload that does not decode as the handler's type fails here, as the worker would fail it.
        let prepared = match handler.prepare(event) {
            Ok(prepared) => prepared,
            Err(unusable) => {
                table::mark_unusable(&mut tx, env.provider, &e.event_id, &unusable).await?;
                continue;
            }
        };
        if prepared.hint().is_some() {
            continue; // its object is fetched by the worker, never inside this transaction
        }
        let mut savepoint = tx.begin().await?;
        match prepared.run(&mut savepoint).await {
            Ok(_) => {
                savepoint.commit().await?;
                table::mark_done_inline(&mut tx, env.provider, &e.event_id).await?;
            }
            Err(HandlerError::Database(err)) if db::is_connection_lost(&err) => return Err(err),
            Err(err) => {
                savepoint.rollback().await?;
                tracing::info!(provider = %env.provider, event_id = %Escaped(&e.event_id), error = %Escaped(&err), "inline handler failed; left pending for the worker");
                table::note_inline_failure(&mut tx, env.provider, &e.event_id, &format!("attempt 1 (inline): {err}"))
                    .await?;
            }
        }
    }
    tx.commit().await?;
    Ok(claimed)
}
