//! A hint handler's events, after their batch committed: each one's object
//! fetched with no transaction open, then each applied in a transaction of
//! its own ([`crate::process::hints`]).

use std::time::{Duration, Instant};

use super::{ended, finished_row, Batch, Processed, Worker};
use crate::{
    db::{
        self,
        inbox::{self, Taken},
    },
    process::{
        handler::HandlerError,
        handlers::erased::Prepared,
        hints::{FetchError, Fetched, Object},
    },
    runtime::{stage::Tally, trace},
};
use webhook_inbox_schemes::Provider;

/// A hint handler's event, held by its lease while its object is fetched.
pub(super) struct Deferred<'h> {
    pub(super) provider: String,
    pub(super) event_id: String,
    pub(super) object: Object,
    pub(super) prepared: Box<dyn Prepared + 'h>,
    pub(super) span: Option<trace::Span>,
}

/// How long a hint handler's event is held back while its object is fetched
/// (the fetch's own tries fit well within it); then any worker may take it.
pub(super) const HINT_LEASE: Duration = Duration::from_secs(60);

/// Objects fetched at once, after a batch.
const HINT_FETCHES: usize = 8;

impl Worker {
    /// A committed batch's counts, with its hint handlers' events applied.
    pub(super) async fn then_hints(&self, batch: Batch<'_>, deadline: Instant) -> Result<Processed, sqlx::Error> {
        let (mut counts, deferred) = match batch {
            Batch::Done(counts, deferred) => (counts, deferred),
            Batch::Redo => unreachable!("a guarded batch is never redone"),
        };
        counts.add(&self.fetch_and_apply(deferred, deadline).await?);
        Ok(counts)
    }

    /// The batch's hint handlers' events, now that it committed: their
    /// objects fetched with no transaction open ([`HINT_FETCHES`] at a time),
    /// then each applied in a transaction of its own. A fetch the deadline
    /// cuts short leaves its event to wait for its lease to end.
    async fn fetch_and_apply(&self, deferred: Vec<Deferred<'_>>, deadline: Instant) -> Result<Processed, sqlx::Error> {
        use futures_util::StreamExt;
        let until = tokio::time::Instant::from_std(deadline);
        type Fetch<'a> =
            std::pin::Pin<Box<dyn std::future::Future<Output = Option<Result<Fetched, FetchError>>> + Send + 'a>>;
        let fetches: Vec<Fetch<'_>> = deferred.iter().map(|d| Box::pin(self.fetch(d, until)) as Fetch<'_>).collect();
        let fetches: Vec<_> = futures_util::stream::iter(fetches).buffered(HINT_FETCHES).collect().await;
        let mut counts = Processed::default();
        for (mut d, fetched) in deferred.into_iter().zip(fetches) {
            let Some(fetched) = fetched else {
                continue; // the deadline came first
            };
            let mut tx = self.pool.begin().await?;
            db::pauses::enter(&mut tx).await?;
            // Still ours: pending, held by the lease, not taken by another worker meanwhile, nor paused.
            let Some(row) = inbox::take_counted(&mut tx, &d.provider, &d.event_id).await?.pop() else {
                continue;
            };
            // take_counted reads a counted attempt; this one is not counted yet.
            let row = Taken { attempts: row.attempts + 1, ..row };
            counts.taken += 1;
            let end = match &fetched {
                Ok(fetched) => self.apply_to(&mut tx, &row, d.prepared.as_ref(), Some(fetched), &mut counts).await?,
                Err(FetchError::Transient(reason)) => {
                    self.after_failure(&row, HandlerError::Transient(reason.clone()), &mut counts)
                }
                Err(e @ (FetchError::NotFound(_) | FetchError::Permanent(_))) => {
                    self.after_failure(&row, HandlerError::Permanent(e.to_string()), &mut counts)
                }
            };
            ended(d.span.as_mut(), &end);
            inbox::finish(&mut tx, &[finished_row(row, end, false)]).await?;
            tx.commit().await?;
        }
        Ok(counts)
    }

    /// `d`'s object, or `None` if `until` came first.
    async fn fetch(&self, d: &Deferred<'_>, until: tokio::time::Instant) -> Option<Result<Fetched, FetchError>> {
        let provider = Provider::try_from(d.provider.as_str()).ok();
        match provider.and_then(|p| self.apis.get(p)) {
            Some(api) => tokio::time::timeout_at(until, api.fetch(&d.object)).await.ok(),
            None => Some(Err(FetchError::Transient(format!(
                "no API to fetch {} objects from (for Stripe: STRIPE_API_KEY)",
                d.provider
            )))),
        }
    }
}
