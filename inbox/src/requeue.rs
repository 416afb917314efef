//! Events back to pending: `inbox replay` (one) and `inbox requeue` (a
//! selection, in batches, each audited).

use std::ops::ControlFlow;

use anyhow::{bail, Result};
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::ops::{self, Audit, Filter, Replayed};

use crate::cli::{check_times, print_json, progress, Output, BATCH};

pub(crate) async fn replay(pool: &PgPool, provider: &str, event_id: &str, by: &Audit<'_>, out: &Output) -> Result<()> {
    let replayed = ops::replay(pool, provider, event_id, by).await?;
    let from = match &replayed {
        Replayed::NotFound => bail!("no event {event_id:?} from provider {provider:?}"),
        Replayed::AlreadyPending => bail!("{provider} {event_id} is already pending: nothing to replay"),
        Replayed::WithoutPayload => bail!(
            "{provider} {event_id} was stored without a payload (its body was never usable; see its failure reason): no handler could take it"
        ),
        Replayed::Erased { at, by } => {
            bail!("{provider} {event_id} was erased on {at} by {by}: nothing is left to process")
        }
        Replayed::Requeued { from } => from,
    };
    if out.json {
        print_json(&json!({"provider": provider, "event_id": event_id, "requeued_from": from}));
    } else {
        say!("{provider} {event_id}: {from} -> pending, attempts reset (audited as {:?} by {})", by.reason, by.actor);
    }
    Ok(())
}

pub(crate) async fn requeue(pool: &PgPool, filter: &Filter, by: &Audit<'_>, dry_run: bool, out: &Output) -> Result<()> {
    check_times(pool, &filter.since, &filter.until).await?;
    let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
    let what = format!("{} event(s)", statuses.join(" or "));
    if dry_run {
        let found = ops::count_matching(pool, filter).await?;
        if out.json {
            print_json(
                &json!({"matching": found.matching, "without_payload": found.without_payload, "requeued": 0, "dry_run": true}),
            );
        } else {
            say!(
                "{} {what} match, {} of them without a payload (skipped); nothing changed (--dry-run)",
                found.matching,
                found.without_payload
            );
        }
        return Ok(());
    }
    let bar = progress(0, "requeued", out);
    let done = ops::requeue_all(pool, filter, by, BATCH, |so_far| {
        bar.set_length((so_far.matching - so_far.without_payload).max(0) as u64);
        bar.set_position(so_far.requeued);
        ControlFlow::Continue(())
    })
    .await?;
    bar.finish_and_clear();
    if out.json {
        let mut report = serde_json::to_value(done)?;
        report["dry_run"] = false.into();
        print_json(&report);
    } else {
        say!("{} {what} back to pending, attempts reset (audited as {:?} by {})", done.requeued, by.reason, by.actor);
        if done.held > 0 {
            say!(
                "{} left where they were: another transaction held them (a worker, prune) or they changed meanwhile; run the same requeue again",
                done.held
            );
        }
        if done.without_payload > 0 {
            say!(
                "{} skipped: without a payload (their body was never usable, or they were erased; `inbox show` says which)",
                done.without_payload
            );
        }
    }
    Ok(())
}
