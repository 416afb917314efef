//! A [`BatchHandler`](crate::BatchHandler)'s events in a worker batch:
//! gathered while the batch is prepared, applied in one call, and applied one
//! at a time, each in its own savepoint, when that call fails.

use std::time::Instant;

use sqlx::{Acquire, Postgres, Transaction};

use super::{count_outcome, Finish, Mode, Processed, Worker};
use crate::{
    db::{self, inbox::Taken},
    process::{
        handler::HandlerError,
        handlers::erased::{Erased, Prepared, PreparedBatch, RawEvent},
    },
    runtime::trace,
};
use webhook_inbox_schemes::text::Escaped;

/// What the worker runs: an event, or a batch handler's events of the batch.
// A batch's runs are built and moved once; with traces off the variants are closer.
#[allow(clippy::large_enum_variant)]
pub(super) enum Run<'h> {
    One(Box<dyn Prepared + 'h>, Taken, Option<trace::Span>),
    Group(Box<dyn PreparedBatch + 'h>, Vec<(Taken, Option<trace::Span>)>),
}

/// A worker batch's events for its batch handlers, a group per handler.
#[derive(Default)]
pub(super) struct Groups<'h> {
    groups: Vec<Group<'h>>,
    /// The group [`Groups::add`] last added an event to.
    last: Option<usize>,
}

struct Group<'h> {
    /// The registered handler's address: one handler registered for several types is one group.
    handler: usize,
    events: Box<dyn PreparedBatch + 'h>,
    members: Vec<(Taken, Option<trace::Span>)>,
}

impl<'h> Groups<'h> {
    /// `event` ready for `handler` alone (`Some`), or added to the handler's
    /// group (`None`: [`Groups::joined`] takes its row next); or why its
    /// payload does not decode as the handler's type.
    pub(super) fn add(
        &mut self,
        handler: &'h dyn Erased,
        event: RawEvent,
    ) -> Result<Option<Box<dyn Prepared + 'h>>, String> {
        let id = handler as *const dyn Erased as *const () as usize;
        let i = match self.groups.iter().position(|g| g.handler == id) {
            Some(i) => i,
            None => match handler.batch() {
                Some(events) => {
                    self.groups.push(Group { handler: id, events, members: Vec::new() });
                    self.groups.len() - 1
                }
                None => return handler.prepare(event).map(Some),
            },
        };
        self.groups[i].events.push(event)?;
        self.last = Some(i);
        Ok(None)
    }

    /// The row (and span) of the event [`Groups::add`] just added to a group.
    pub(super) fn joined(&mut self, row: Taken, span: Option<trace::Span>) {
        if let Some(i) = self.last.take() {
            self.groups[i].members.push((row, span));
        }
    }

    /// Each group, its events sorted by their lock keys, at its first key.
    pub(super) fn into_runs(self) -> impl Iterator<Item = (Option<String>, Run<'h>)> {
        self.groups.into_iter().filter(|g| !g.members.is_empty()).map(|mut g| {
            let mut members: Vec<_> = g.members.into_iter().map(Some).collect();
            let members = g.events.sort().into_iter().map(|i| members[i].take().expect("each position once")).collect();
            (g.events.first_key(), Run::Group(g.events, members))
        })
    }
}

impl Worker {
    /// A batch handler's events: how each ends, or `None` when an optimistic
    /// batch must run again guarded (the handler failed; nothing recorded).
    /// Guarded, the call runs in a savepoint; if it fails, each event runs
    /// alone in a savepoint of its own, so the failure is recorded on the
    /// event that caused it and the others' effects commit; those past the
    /// deadline are left out (pending, their locks gone with the commit).
    /// `Err` only when the batch cannot go on (the connection is gone).
    pub(super) async fn apply_group(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        events: &dyn PreparedBatch,
        members: &mut [(Taken, Option<trace::Span>)],
        (mode, deadline): (Mode, Instant),
        counts: &mut Processed,
    ) -> Result<Option<Vec<Finish>>, sqlx::Error> {
        let n = members.len();
        let all_done = |outcomes: Vec<_>, counts: &mut Processed| {
            outcomes.into_iter().for_each(|o| count_outcome(o, counts));
            Some((0..n).map(|_| Finish::Done).collect())
        };
        if mode == Mode::Optimistic {
            return match events.run(tx, None).await {
                Ok(outcomes) => Ok(all_done(outcomes, counts)),
                Err(HandlerError::Database(e)) if db::is_connection_lost(&e) => Err(e),
                Err(e) => {
                    for span in members.iter_mut().filter_map(|(_, span)| span.as_mut()) {
                        span.fail(format!("rolled back with its batch, to run again with savepoints: {e}"));
                    }
                    Ok(None)
                }
            };
        }
        let mut savepoint = tx.begin().await?;
        let err = match events.run(&mut savepoint, None).await {
            Ok(outcomes) => {
                savepoint.commit().await?;
                return Ok(all_done(outcomes, counts));
            }
            Err(HandlerError::Database(e)) if db::is_connection_lost(&e) => return Err(e),
            Err(e) => e,
        };
        savepoint.rollback().await?;
        if let [(row, _)] = members {
            return Ok(Some(vec![self.after_failure(row, err, counts)]));
        }
        // Worth a warning even when each event then succeeds alone: the handler's statements fail on a batch.
        tracing::warn!(events = n, error = %Escaped(&err), "a batch handler failed; its events run one at a time");
        let mut ends = Vec::with_capacity(n);
        for (i, (row, _)) in members.iter().enumerate() {
            if Instant::now() >= deadline {
                break;
            }
            let mut savepoint = tx.begin().await?;
            match events.run(&mut savepoint, Some(i)).await {
                Ok(outcomes) => {
                    savepoint.commit().await?;
                    outcomes.into_iter().for_each(|o| count_outcome(o, counts));
                    ends.push(Finish::Done);
                }
                Err(HandlerError::Database(e)) if db::is_connection_lost(&e) => return Err(e),
                Err(e) => {
                    savepoint.rollback().await?;
                    ends.push(self.after_failure(row, e, counts));
                }
            }
        }
        Ok(Some(ends))
    }
}
