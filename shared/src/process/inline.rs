//! The handlers inline mode runs inside receive's claim (`INBOX_INLINE_PROVIDERS`):
//! the process stage's side of [`InlineHandlers`].

use std::time::SystemTime;

use futures_util::future::BoxFuture;
use sqlx::{Acquire, PgConnection};
use webhook_inbox_schemes::{NewEvent, Provider};

use crate::{
    core::rules::IgnoreRules,
    db,
    process::{
        handler::{HandlerError, Headers},
        handlers::{erased::RawEvent, Handlers},
    },
    receive::{
        claim::{
            inline::{Applied, InlineHandlers},
            Envelope,
        },
        receiver::Receiver,
    },
};

/// The worker's handlers and ignore rules, as inline receive runs them.
pub(crate) struct Inline {
    handlers: Handlers,
    rules: IgnoreRules,
}

impl InlineHandlers for Inline {
    fn handles(&self, provider: Provider, event_type: &str) -> Option<bool> {
        self.handlers.get(provider, event_type).map(|h| h.exclusive())
    }

    fn apply<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        env: &'a Envelope<'a>,
        e: &'a NewEvent,
    ) -> BoxFuture<'a, Result<Applied, sqlx::Error>> {
        Box::pin(async move {
            let Some(handler) = self.handlers.get(env.provider, &e.event_type) else {
                return Ok(Applied::Left);
            };
            // An event a rule ignores is the worker's to mark `ignored`, and count.
            if self.rules.ignoring(env.provider, &e.event_type, e.payload.as_deref()).is_some() {
                return Ok(Applied::Left);
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
                Err(unusable) => return Ok(Applied::Unusable(unusable)),
            };
            if prepared.hint().is_some() {
                return Ok(Applied::Left); // its object is fetched by the worker, never inside this transaction
            }
            let mut savepoint = tx.begin().await?;
            match prepared.run(&mut savepoint).await {
                Ok(_) => {
                    savepoint.commit().await?;
                    Ok(Applied::Done)
                }
                Err(HandlerError::Database(err)) if db::is_connection_lost(&err) => Err(err),
                Err(err) => {
                    savepoint.rollback().await?;
                    Ok(Applied::Failed(err.to_string()))
                }
            }
        })
    }
}

impl Receiver {
    /// The handlers inline mode runs (`INBOX_INLINE_PROVIDERS`): the worker's
    /// own, with the ignore rules receive was configured with.
    pub fn with_handlers(self, handlers: Handlers) -> Self {
        let rules = self.ignore_rules().clone();
        self.with_inline(Inline { handlers, rules })
    }
}
