//! `inbox jobs`: the requeues and erasures the management API runs in the
//! background (`inbox_api_jobs`): the latest, one in full, and a cancel.

use anyhow::Result;
use clap::Subcommand;
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox::ops::{self, Canceller, Job};

use crate::cli::{print_json, print_table, Output};

#[derive(Subcommand, Debug)]
pub(crate) enum JobsCommand {
    /// One job: what it was asked, how far it is, what it did.
    Show {
        /// The job's id (see `inbox jobs`).
        id: i64,
    },
    /// Ask a running job to stop: it stops within its current event or batch,
    /// and what it did stays done (audited as cancel_job).
    Cancel {
        /// The job's id (see `inbox jobs`).
        id: i64,
    },
}

/// `inbox jobs`: the latest `limit`, newest first; or a command on one.
pub(crate) async fn act(
    pool: &PgPool,
    command: Option<JobsCommand>,
    limit: i64,
    actor: &str,
    out: &Output,
) -> Result<()> {
    let job = match command {
        None => {
            list(&ops::jobs(pool, limit.clamp(1, 1000)).await?, out);
            return Ok(());
        }
        Some(JobsCommand::Show { id }) => ops::job(pool, id).await?,
        Some(JobsCommand::Cancel { id }) => {
            let job = ops::cancel_job(pool, id, Canceller::Operator(actor)).await?;
            if !out.json {
                say!("job {id} asked to stop: it stops within its current event or batch (what it did stays done)");
            }
            job
        }
    };
    if out.json {
        print_json(&json!(job));
    } else {
        list(std::slice::from_ref(&job), out);
        say!("asked: {}", ops::escape(&job.params.0.to_string()));
        if let Some(result) = &job.result {
            say!("result: {}", ops::escape(&result.0.to_string()));
        }
        if let Some(why) = &job.error {
            say!("error: {}", ops::escape(why));
        }
    }
    Ok(())
}

fn list(jobs: &[Job], out: &Output) {
    if out.json {
        print_json(&json!(jobs));
        return;
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let progress = match j.estimate {
                Some(of) => format!("{}/{of}", j.processed),
                None => j.processed.to_string(),
            };
            let ended = j.finished_at.clone().unwrap_or_default();
            vec![
                j.id.to_string(),
                j.kind.clone(),
                j.state.clone(),
                progress,
                j.created_by.clone(),
                j.created_at.clone(),
                ended,
            ]
        })
        .collect();
    print_table(&["#", "kind", "state", "progress", "by", "started", "ended"], &rows);
}
