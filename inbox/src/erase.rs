//! `inbox erase`: one event's personal data, or a selection's, gone; the keys stay.

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use sqlx::PgPool;
use std::ops::ControlFlow;

use webhook_inbox::ops::{self, Audit, EraseOptions, Erased, EventQuery, PayloadMatch, Since};

use crate::cli::{print_json, progress, Output};

/// What `inbox erase` selects.
#[derive(Args, Debug)]
pub(crate) struct Selection {
    #[arg(long, value_parser = crate::cli::provider_name)]
    pub provider: Option<String>,
    /// Exactly this event (with --provider).
    #[arg(long, requires = "provider", conflicts_with_all = ["event_type", "since", "until", "payload"])]
    pub id: Option<String>,
    /// Exactly this event type.
    #[arg(long = "type")]
    pub event_type: Option<String>,
    /// Received at or after: 30m, 2h, 7d (ago), or a timestamp.
    #[arg(long, value_parser = Since::parse)]
    pub since: Option<Since>,
    /// Received before: 30m, 2h, 7d (ago), or a timestamp.
    #[arg(long, value_parser = Since::parse)]
    pub until: Option<Since>,
    /// Events whose payload holds this text (an e-mail address, a customer id), or this JSON;
    /// bound it with --since (a search stops after 3 s).
    #[arg(long, value_parser = |t: &str| Ok::<_, String>(PayloadMatch::parse(t)))]
    pub payload: Option<PayloadMatch>,
}

pub(crate) async fn erase(
    pool: &PgPool,
    s: Selection,
    options: EraseOptions,
    by: &Audit<'_>,
    out: &Output,
) -> Result<()> {
    // The audit record outlives the erasure: it names the request, not the person.
    if let Err(why) = ops::erase_reason(by.reason, s.payload.as_ref()) {
        bail!("--reason: {why}");
    }
    let dry_run = options.dry_run;
    if let (Some(provider), Some(id)) = (&s.provider, &s.id) {
        if dry_run {
            let found = ops::stored_event(pool, provider, id).await?;
            let what = match &found {
                None => "not stored",
                Some(e) if e.erased_at.is_some() => "erased already",
                Some(e) if e.status == ops::Status::Pending => "pending: it would be left as it is",
                Some(_) => "would be erased",
            };
            if out.json {
                print_json(&json!({"provider": provider, "event_id": id, "found": found.is_some(), "dry_run": true}));
            } else {
                say!("{provider} {id}: {what}");
            }
            return Ok(());
        }
        return match ops::erase(pool, provider, id, by).await? {
            Erased::Erased { messages, siblings } => {
                if out.json {
                    print_json(&json!({"provider": provider, "event_id": id, "erased": true,
                                       "outbox_messages": messages, "batch_siblings": siblings}));
                } else {
                    say!(
                        "{provider} {id} erased: its payload, raw bytes, headers and failure reason are gone, \
                         and the payloads of its {messages} outbox message(s) (those not sent are dead); \
                         its key stays, so a redelivery is still a duplicate"
                    );
                    if siblings > 0 {
                        say!(
                            "its batch's body went too: {siblings} other event(s) of the batch keep their payloads, \
                             not the batch's raw bytes"
                        );
                    }
                }
                Ok(())
            }
            Erased::Already { at, by } => bail!("{provider} {id} was erased already, on {at} by {by}"),
            Erased::Pending => bail!(
                "{provider} {id} is pending: erase it once it is processed, or pause {provider} first (`inbox pause`)"
            ),
            Erased::NotFound => bail!("no event {id:?} from provider {provider:?}"),
        };
    }
    if s.provider.is_none() && s.event_type.is_none() && s.since.is_none() && s.until.is_none() && s.payload.is_none() {
        bail!(
            "name what to erase: --provider and --id, or a selection (--provider, --type, --since, --until, --payload)"
        );
    }
    let query = EventQuery {
        provider: s.provider,
        event_type: s.event_type,
        since: s.since,
        until: s.until,
        payload: s.payload,
        ..EventQuery::default()
    };
    let bar = progress(0, "erased", out);
    let done = ops::erase_matching(pool, &query, by, options, |e| {
        bar.set_position(e.erased);
        ControlFlow::Continue(())
    })
    .await;
    bar.finish_and_clear();
    let done = match done {
        Ok(done) => done,
        Err(ops::EraseError::TooMany { erasable, at_most }) => bail!(
            "the selection holds {erasable} event(s) to erase, more than --at-most {at_most}: nothing was erased \
             (narrow it, or raise --at-most)"
        ),
        Err(ops::EraseError::Database(e)) => return Err(e.into()),
    };
    if out.json {
        print_json(&json!({"dry_run": dry_run, "erasure": done}));
    } else if dry_run {
        say!(
            "{} event(s) selected: {} would be erased, {} pending left as they are (nothing changed)",
            done.matching,
            done.erased,
            done.pending
        );
    } else {
        say!(
            "{} event(s) selected: {} erased, {} erased already, {} pending left as they are (erase them once processed)",
            done.matching,
            done.erased,
            done.already,
            done.pending
        );
    }
    Ok(())
}
