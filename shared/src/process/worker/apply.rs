//! A batch's events through their handlers: in the order of their lock keys,
//! a batch handler's events together, each outcome turned into how the event
//! ends (done, unhandled, ignored, retried later, failed).

use std::time::Instant;

use sqlx::{Acquire, Postgres, Transaction};

use super::{count_outcome, ended, finished_row, Batch, Deferred, Finish, Mode, Processed, Worker};
use crate::{
    db::{
        self,
        inbox::{self, Taken},
    },
    process::{
        handler::{HandlerError, Headers},
        handlers::erased::{Prepared, RawEvent},
        hints::Fetched,
        worker::group::{Groups, Run},
    },
    runtime::trace,
};
use webhook_inbox_schemes::{text::Escaped, Provider};

impl Worker {
    /// `precounted`: the attempt was already committed (careful mode).
    pub(super) async fn apply_all(
        &self,
        mut tx: Transaction<'static, Postgres>,
        rows: Vec<Taken>,
        deadline: Instant,
        precounted: bool,
        mode: Mode,
    ) -> Result<Batch<'_>, sqlx::Error> {
        let mut counts = Processed::default();
        let mut finished = Vec::with_capacity(rows.len());
        let finished_as = |row: Taken, end: Finish| finished_row(row, end, precounted);
        let mut deferred = Vec::new();
        // Events no handler can run end at once; the others run in the order of
        // their lock keys (see [`crate::Handler::lock_key`]), receive order among
        // equals, a batch handler's events together at its first key.
        let mut runs = Vec::new();
        let mut groups = Groups::default();
        for row in rows {
            if row.held_by.is_some() {
                counts.held += 1; // marked held by the take: left to its pause
                continue;
            }
            if Instant::now() >= deadline {
                break; // left pending; its lock goes with the commit
            }
            // A child of the delivery's receive span, when traces are on.
            let mut span = trace::start("process", trace::Kind::Consumer, row.trace_context.as_deref());
            if let Some(span) = &mut span {
                span.set("webhook.provider", row.provider.as_str());
                span.set("webhook.event_type", webhook_inbox_schemes::text::escape(&row.event_type));
                span.set("webhook.event_id", webhook_inbox_schemes::text::escape(&row.event_id));
            }
            let traceparent = span.as_ref().map(trace::Span::traceparent);
            match self.prepare(&row, traceparent, &mut groups, &mut counts) {
                Ok(Some(prepared)) => runs.push((prepared.lock_key(), Run::One(prepared, row, span))),
                Ok(None) => groups.joined(row, span),
                Err(end) => {
                    counts.taken += 1;
                    ended(span.as_mut(), &end);
                    finished.push(finished_as(row, end));
                }
            }
        }
        runs.extend(groups.into_runs());
        runs.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, run) in runs {
            if Instant::now() >= deadline {
                break;
            }
            let (prepared, row, mut span) = match run {
                Run::One(prepared, row, span) => (prepared, row, span),
                Run::Group(group, mut members) => {
                    let how = (mode, deadline);
                    let applied = self.apply_group(&mut tx, group.as_ref(), &mut members, how, &mut counts).await?;
                    let Some(ends) = applied else {
                        tx.rollback().await?;
                        return Ok(Batch::Redo);
                    };
                    // Past the deadline, the rest of the group is left pending.
                    counts.taken += ends.len();
                    for ((row, mut span), end) in members.into_iter().zip(ends) {
                        ended(span.as_mut(), &end);
                        finished.push(finished_as(row, end));
                    }
                    continue;
                }
            };
            let mode = match prepared.hint() {
                // Fetched after the commit, outside any transaction; held meanwhile by its lease.
                Some(Ok(object)) => {
                    let lease = Finish::Lease;
                    let (provider, event_id) = (row.provider.clone(), row.event_id.clone());
                    finished.push(finished_as(row, lease));
                    deferred.push(Deferred { provider, event_id, object, prepared, span });
                    continue;
                }
                Some(Err(e)) => {
                    counts.taken += 1;
                    let end = self.after_failure(&row, e, &mut counts);
                    ended(span.as_mut(), &end);
                    finished.push(finished_as(row, end));
                    continue;
                }
                None => mode,
            };
            counts.taken += 1;
            let end = match mode {
                Mode::Guarded => self.apply_to(&mut tx, &row, prepared.as_ref(), None, &mut counts).await?,
                Mode::Optimistic => match prepared.run(&mut tx).await {
                    Ok(outcome) => {
                        count_outcome(outcome, &mut counts);
                        Finish::Done
                    }
                    Err(HandlerError::Database(e)) if db::is_connection_lost(&e) => return Err(e),
                    Err(e) => {
                        // Its writes, and the batch's, go; the batch runs again guarded.
                        if let Some(span) = &mut span {
                            span.fail(format!("rolled back with its batch, to run again with savepoints: {e}"));
                        }
                        tx.rollback().await?;
                        return Ok(Batch::Redo);
                    }
                },
            };
            ended(span.as_mut(), &end);
            finished.push(finished_as(row, end));
        }
        inbox::finish(&mut tx, &finished).await?;
        tx.commit().await?;
        Ok(Batch::Done(counts, deferred))
    }

    /// The event, ready for its handler (`None`: added to its batch handler's
    /// group), or how the event ends without one (no handler: unhandled; an
    /// unknown provider, or a payload that does not decode as the handler's
    /// type: failed).
    fn prepare<'h>(
        &'h self,
        row: &Taken,
        trace_context: Option<String>,
        groups: &mut Groups<'h>,
        counts: &mut Processed,
    ) -> Result<Option<Box<dyn Prepared + 'h>>, Finish> {
        let Ok(provider) = Provider::try_from(row.provider.as_str()) else {
            counts.failed += 1;
            return Err(Finish::Failed(format!("unknown provider {:?}", row.provider)));
        };
        if let Some(rule) = self.config.rules.ignoring(provider, &row.event_type, row.payload.as_deref()) {
            counts.ignored += 1;
            return Err(Finish::Ignored(format!("ignored by the rule {:?} (INBOX_RULES_FILE)", rule.name())));
        }
        let Some(handler) = self.handlers.get(provider, &row.event_type) else {
            counts.unhandled += 1;
            return Err(Finish::Unhandled);
        };
        let event = RawEvent {
            provider,
            event_id: row.event_id.clone(),
            event_type: row.event_type.clone(),
            payload: row.payload.clone(),
            attempts: row.attempts,
            received_at: RawEvent::received_at_micros(row.received_at_us),
            headers: row.headers.as_ref().map(|h| Headers::from_json(&h.0)).unwrap_or_default(),
            trace_context,
            written: Some(self.written.clone()),
        };
        groups.add(handler, event).map_err(|unusable| {
            counts.failed += 1;
            tracing::warn!(provider = %row.provider, event_id = %Escaped(&row.event_id), reason = %Escaped(&unusable), "event failed");
            Finish::Failed(unusable)
        })
    }

    /// One event inside its own savepoint (a hint handler's with its object
    /// `fetched`). `Err` only when the batch cannot go on (the connection is
    /// gone); every event-level failure is a [`Finish`].
    pub(super) async fn apply_to(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        row: &Taken,
        prepared: &dyn Prepared,
        fetched: Option<&Fetched>,
        counts: &mut Processed,
    ) -> Result<Finish, sqlx::Error> {
        let mut savepoint = tx.begin().await?;
        let result = match fetched {
            Some(fetched) => prepared.run_fetched(&mut savepoint, fetched).await,
            None => prepared.run(&mut savepoint).await,
        };
        match result {
            Ok(outcome) => {
                savepoint.commit().await?;
                count_outcome(outcome, counts);
                Ok(Finish::Done)
            }
            Err(HandlerError::Database(e)) if db::is_connection_lost(&e) => Err(e),
            Err(e) => {
                savepoint.rollback().await?;
                Ok(self.after_failure(row, e, counts))
            }
        }
    }

    pub(super) fn after_failure(&self, row: &Taken, err: HandlerError, counts: &mut Processed) -> Finish {
        if err.is_contention() {
            counts.retried += 1;
            let reason = format!("contention (not counted as an attempt): {err}");
            return Finish::Retry { after: self.config.backoff(0), reason, counted: false };
        }
        let attempts = row.attempts + 1;
        let reason = format!("attempt {attempts}: {err}");
        if err.is_transient() && attempts < self.config.max_attempts {
            counts.retried += 1;
            tracing::info!(provider = %row.provider, event_id = %Escaped(&row.event_id), reason = %Escaped(&reason), "retrying later");
            Finish::Retry { after: self.config.backoff(row.attempts), reason, counted: true }
        } else {
            counts.failed += 1;
            tracing::warn!(provider = %row.provider, event_id = %Escaped(&row.event_id), reason = %Escaped(&reason), "event failed");
            Finish::Failed(reason)
        }
    }
}
