//! `inbox`: the local and operator's binary.

/// A line for a person: the whole line escaped ([`webhook_inbox::ops::escape`]),
/// so that nothing stored reaches the terminal raw. Every human line goes through it.
/// A closed stdout (`inbox failed | head`) ends the output, not the process with a panic.
macro_rules! say {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), "{}", webhook_inbox::ops::escape(&format!($($arg)*)));
    }};
}

mod alerts;
mod archive;
mod cli;
mod console;
mod demo;
mod erase;
mod events;
mod jobs;
mod outbox;
mod passes;
mod pauses;
mod requeue;
mod rules;

use std::time::Duration;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use webhook_inbox::{
    config::{self, DbConfig},
    ops::{Audit, Cursor, EventQuery, Filter, IdMatch, PayloadMatch, Since, Status},
    ReceiveConfig,
};
use webhook_inbox_service::dev;

#[derive(Parser)]
#[command(name = "inbox", version, about = "Idempotent webhook inbox on PostgreSQL")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run everything locally: webhooks, worker, relay, console.
    ///
    /// Serve POST /webhooks/{provider} and run process, relay, prune and reconcile on their schedules,
    /// in-process, on DATABASE_URL or an embedded throwaway PostgreSQL.
    Dev {
        #[arg(long, env = "PORT", default_value_t = 9000)]
        port: u16,
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Run the stock application (its handlers and tables: orders, payments, accounts, ...)
        /// on DATABASE_URL too; its throwaway database always runs it.
        #[arg(long, env = "INBOX_STOCK", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
        stock: bool,
    },
    /// The production service, for a container.
    ///
    /// The production service, for a container: the stages as long-running roles on DATABASE_URL
    /// (receive with group commit, process, relay, prune, reconcile; the console when named), with
    /// /healthz, /readyz and Prometheus /metrics, and a drain on SIGTERM. No embedded PostgreSQL, no
    /// development secret: configured exactly as the functions are.
    Serve {
        /// Comma-separated: receive, process, relay, prune, reconcile, console, or all [default: all but console].
        #[arg(long, env = "INBOX_ROLES", value_parser = |t: &str| webhook_inbox_service::serve::Roles::parse(t))]
        roles: Option<webhook_inbox_service::serve::Roles>,
        /// The webhooks, the console, /healthz and /readyz.
        #[arg(long, env = "PORT", default_value_t = 8080)]
        port: u16,
        /// /healthz, /readyz and /metrics (the same as --port to serve all on one).
        #[arg(long, env = "INBOX_ADMIN_PORT", default_value_t = 9090)]
        admin_port: u16,
        #[arg(long, env = "INBOX_HOST", default_value = "0.0.0.0")]
        host: String,
        /// Where the admin port listens [default: --host].
        #[arg(long, env = "INBOX_ADMIN_HOST")]
        admin_host: Option<String>,
        /// Apply the migrations before serving (else they must be applied: `inbox migrate`).
        #[arg(long)]
        migrate: bool,
        /// Run the stock application (its handlers and its tables) [default: the inbox alone:
        /// events no handler takes end `unhandled`].
        #[arg(long, env = "INBOX_STOCK", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
        stock: bool,
    },
    /// The console: find, inspect and replay events in a browser.
    ///
    /// The console: a web page to find any event, see why it failed and replay it, on DATABASE_URL
    /// (sign-in required; `inbox console user add` makes users). `inbox dev` serves it at /console.
    Console {
        #[command(subcommand)]
        command: Option<console::ConsoleCommand>,
        #[arg(long, env = "PORT", default_value_t = 9100)]
        port: u16,
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
    },
    /// Apply the inbox's migrations.
    ///
    /// Apply the inbox's migrations to DATABASE_URL (a team's binaries apply their own
    /// application's after them: App::migrate).
    Migrate {
        /// The stock application's too (its tables: orders, payments, accounts, ...), for `serve --stock`.
        #[arg(long, env = "INBOX_STOCK", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
        stock: bool,
    },
    /// The providers configured here, and the URL to give each.
    ///
    /// The providers with a secret here: the URL to give each, its signature
    /// header and redelivery window (INBOX_PROVIDERS_FILE's included).
    Providers {
        /// Where the routes are served: the stack's API URL once deployed.
        #[arg(long, default_value = "http://127.0.0.1:9000")]
        base_url: String,
        /// Every provider known here, with a secret or not.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Deliver the due outbox messages.
    ///
    /// One pass of the `relay` function: deliver due outbox messages, print the counts.
    Relay {
        /// One pass, as always (accepted for older scripts; `inbox dev` relays continuously).
        #[arg(long, hide = true)]
        once: bool,
    },
    /// Fetch what providers never delivered.
    ///
    /// One pass of the `reconcile` function: fetch what providers never delivered, print the counts.
    Reconcile {
        /// One pass, as always (accepted for older scripts; schedule it for more).
        #[arg(long, hide = true)]
        once: bool,
    },
    /// Delete what is past its retention.
    ///
    /// One pass of the `prune` function: delete what is past its retention, print the counts.
    Prune {
        /// One pass, as always (accepted for older scripts; schedule it for more).
        #[arg(long, hide = true)]
        once: bool,
    },
    /// Counts, queue age, outbox backlog, secrets in use.
    ///
    /// Counts by provider and status, the queue's age, the outbox backlog, failures
    /// in the last hour, and which secret verified recent deliveries.
    Stats {
        #[command(flatten)]
        out: cli::Output,
    },
    /// Failed events with their reasons, the most recent first.
    Failed {
        #[arg(long, value_parser = cli::provider_name)]
        provider: Option<String>,
        /// Failed at or after: 30m, 2h, 7d, or a timestamp.
        #[arg(long, value_parser = Since::parse)]
        since: Option<Since>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Find events by provider, type, status, time or id.
    ///
    /// Events, newest first, by provider, type, status, time received and id
    /// (exact, or a prefix), a page at a time (`--after` the cursor a page ends with).
    Events {
        #[arg(long, value_parser = cli::provider_name)]
        provider: Option<String>,
        /// Exactly this event type (e.g. invoice.paid).
        #[arg(long = "type")]
        event_type: Option<String>,
        /// In this status: pending, done, unhandled, ignored or failed (repeat, or comma-separate, for several).
        #[arg(long, value_delimiter = ',', value_parser = cli::parse_status)]
        status: Vec<Status>,
        /// Received at or after: 30m, 2h, 7d (ago), or a timestamp.
        #[arg(long, value_parser = Since::parse)]
        since: Option<Since>,
        /// Received before: 30m, 2h, 7d (ago), or a timestamp.
        #[arg(long, value_parser = Since::parse)]
        until: Option<Since>,
        /// Exactly this event id.
        #[arg(long, conflicts_with = "id_prefix")]
        id: Option<String>,
        /// The event ids that start with this text.
        #[arg(long)]
        id_prefix: Option<String>,
        /// Events whose payload holds this text, or this JSON (an object or array: `@>`);
        /// bound it with --since (it stops after 3 s).
        #[arg(long, value_parser = |t: &str| Ok::<_, String>(PayloadMatch::parse(t)))]
        payload: Option<PayloadMatch>,
        /// The page after this cursor (printed at the end of the page before).
        #[arg(long, value_parser = cli::parse_cursor)]
        after: Option<Cursor>,
        /// Events per page (at most 500).
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[command(flatten)]
        out: cli::Output,
    },
    /// One event in full, and whether its bytes still verify.
    ///
    /// One event: headers, payload, attempts, history, and whether its stored
    /// bytes still verify against the secrets configured here.
    Show {
        #[arg(value_parser = cli::provider_name)]
        provider: String,
        event_id: String,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Put one event back to pending; audited.
    ///
    /// Put one event (done or failed) back to pending, attempts reset; audited.
    Replay {
        #[arg(value_parser = cli::provider_name)]
        provider: String,
        event_id: String,
        /// Why, for the audit record.
        #[arg(long, default_value = "replayed by hand", value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Put a selection of events back to pending, in audited batches.
    ///
    /// Put events back to pending, in short batches, each audited: failed ones
    /// after a fix, or unhandled (and done) ones to run a handler deployed
    /// since over them. `--dry-run` counts first.
    Requeue {
        /// Events in this status: unhandled, ignored, failed or done (repeat, or comma-separate, for several).
        #[arg(long, value_delimiter = ',', value_parser = cli::parse_requeue_status, required_unless_present = "failed")]
        status: Vec<Status>,
        /// The same as --status failed.
        #[arg(long)]
        failed: bool,
        #[arg(long, value_parser = cli::provider_name)]
        provider: Option<String>,
        /// Exactly this event type (e.g. invoice.paid).
        #[arg(long = "type")]
        event_type: Option<String>,
        /// Ended (processed, or stored as failed) at or after: 30m, 2h, 7d, or a timestamp.
        #[arg(long, value_parser = Since::parse)]
        since: Option<Since>,
        /// Ended before: 30m, 2h, 7d (ago), or a timestamp.
        #[arg(long, value_parser = Since::parse)]
        until: Option<Since>,
        /// Only events whose failure reason matches this pattern (SQL ILIKE: % and _).
        #[arg(long)]
        reason_like: Option<String>,
        /// Count what would be requeued, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Why, for the audit record.
        #[arg(long, default_value = "requeued by hand", value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Erase events' personal data, keeping their keys.
    ///
    /// Erase events' personal data (payload, raw bytes, kept headers, failure reason, their outbox
    /// messages' payloads), keeping their keys: a redelivery stays a duplicate; each audited. One event
    /// (--provider and --id), or a selection (--provider, --type, --since, --until, --payload).
    Erase {
        #[command(flatten)]
        selection: erase::Selection,
        /// Count what would be erased, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Erase nothing if the selection holds more events to erase than this, and never more.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        at_most: Option<u64>,
        /// Why (a deletion request's reference, never the person), for the audit record.
        #[arg(long, value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
        #[command(flatten)]
        out: cli::Output,
    },
    /// What prune archived to S3.
    ///
    /// Prune's archive (INBOX_ARCHIVE_S3_BUCKET): `archive list` says what it holds, by provider and day.
    Archive {
        #[command(subcommand)]
        command: archive::ArchiveCommand,
    },
    /// Put archived events back.
    ///
    /// Put archived events back into DATABASE_URL as they were (marked restored; prune keeps them
    /// their retention from now), keys stored already skipped: an s3://bucket/prefix (a provider's
    /// month: s3://bucket/inbox/stripe/2026-10), a .jsonl.gz file or a folder. `inbox requeue` then
    /// runs them through today's handlers.
    Restore {
        #[arg(value_parser = |t: &str| webhook_inbox::archive::Location::parse(t))]
        source: webhook_inbox::archive::Location,
        /// Read and count everything, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Take lines no secret configured here verifies (a secret rotated away, Marqeta's Basic
        /// credentials, reconcile's events): their payloads are still what their bytes say.
        #[arg(long)]
        unverified: bool,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Outbox messages, retries, and the relay's destinations.
    ///
    /// Outbox messages waiting (or, with --dead, dead); `outbox retry`, and the
    /// relay's destinations (`outbox destinations`, `pause`, `resume`).
    Outbox {
        #[command(subcommand)]
        command: Option<outbox::OutboxCommand>,
        /// Dead messages instead of waiting ones.
        #[arg(long)]
        dead: bool,
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Pause a provider's events (or one type): received, not processed.
    ///
    /// Pause processing a provider's events, or one type of them: they are still received (200)
    /// and wait, pending, spending no attempt, until `inbox resume`; audited.
    Pause {
        #[command(flatten)]
        scope: pauses::ScopeArgs,
        /// Why, for the audit record and for whoever finds it paused.
        #[arg(long, value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
        /// `inbox pauses` says OVERDUE, and the PauseOverdue alarm fires, after this long: 30m, 4h, 2d.
        #[arg(long, default_value = "4h", value_parser = cli::ago)]
        alarm_after: Duration,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Resume a pause: its held events in receive order.
    ///
    /// Resume a pause: its held events are processed in receive order, then new ones as they come.
    Resume {
        #[command(flatten)]
        scope: pauses::ScopeArgs,
        /// Why, for the audit record.
        #[arg(long, default_value = "resumed by hand", value_parser = |t: &str| webhook_inbox::ops::audit_reason(t))]
        reason: String,
        /// Start the resume and return: the workers release the held events on their passes.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        out: cli::Output,
    },
    /// What is paused, by whom, why, holding how many.
    ///
    /// What is paused, since when, by whom, why, and how many events each pause holds.
    Pauses {
        /// A provider's pauses and resumes (its types' too), oldest first, instead.
        #[arg(long, value_parser = cli::provider_name)]
        history: Option<String>,
        #[command(flatten)]
        out: cli::Output,
    },
    /// The API's background requeues and erasures.
    ///
    /// The requeues and erasures the management API runs in the background, newest first;
    /// `jobs show ID`, `jobs cancel ID` (audited).
    Jobs {
        #[command(subcommand)]
        command: Option<jobs::JobsCommand>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Open alerts: list, acknowledge, resolve, evaluate.
    ///
    /// Alerts (`[[alert]]` in INBOX_RULES_FILE): those open or acknowledged, newest first;
    /// `alerts ack ID`, `alerts resolve ID` (audited), `alerts evaluate` (now).
    Alerts {
        #[command(subcommand)]
        command: Option<alerts::AlertsCommand>,
        /// The latest resolved alerts too.
        #[arg(long)]
        resolved: bool,
        #[command(flatten)]
        out: cli::Output,
    },
    /// Check an ignore rules file against the stored events.
    ///
    /// Ignore rules (INBOX_RULES_FILE): `rules check FILE` checks a file and
    /// tries it on the stored events.
    Rules {
        #[command(subcommand)]
        command: rules::RulesCommand,
    },
    /// The whole pipeline in a minute, every invariant checked.
    ///
    /// The whole pipeline in a minute: a storm of signed deliveries (duplicates,
    /// late retries, out-of-order snapshots, forgeries, a poison event) through
    /// receive, process and relay to a flaky sink, then every invariant checked.
    /// On its own throwaway PostgreSQL unless DATABASE_URL is set (an empty inbox).
    Demo {
        /// PaymentIntents in the storm (orders and Marqeta batches scale with it).
        #[arg(long, default_value_t = 200)]
        payments: usize,
    },
}

/// An error is one line (with its causes) on stderr and exit status 1: an
/// operator's mistake is not a crash, so no backtrace, whatever `RUST_BACKTRACE` says.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    config::init_logging();
    let matches = cli::grouped(Cli::command()).get_matches();
    let parsed = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match run(parsed).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", webhook_inbox::ops::escape(&format!("{e:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Dev { port, host, stock } => {
            // Its own throwaway database runs the stock application; a database of yours
            // (DATABASE_URL, or the one Secrets Manager's DATABASE_SECRET_ARN names) only when asked.
            let env = config::Env::process();
            let yours =
                env.var("DATABASE_URL").is_some() || env.var(config::secrets_manager::DATABASE_SECRET_ARN).is_some();
            let stock = stock || !yours;
            dev::run(application(stock), &host, port).await
        }
        Command::Serve { roles, port, admin_port, host, admin_host, migrate, stock } => {
            let settings = webhook_inbox_service::serve::Settings {
                roles,
                host: Some(host),
                port: Some(port),
                admin_host,
                admin_port: Some(admin_port),
                migrate,
            };
            webhook_inbox_service::serve::run(application(stock), settings).await
        }
        Command::Console { command: None, port, host } => webhook_inbox_service::console::run(&host, port).await,
        Command::Console { command: Some(command), .. } => console::act(&operator_db().await?, command).await,
        Command::Relay { once: _ } => passes::relay().await,
        Command::Reconcile { once: _ } => passes::reconcile().await,
        Command::Prune { once: _ } => passes::prune().await,
        Command::Demo { payments } => {
            let demo = demo::Demo { payments: payments.max(1) };
            let mut ok = false;
            dev::with_database(ReceiveConfig::from_env(16)?, |config| async {
                ok = demo.run(config).await?;
                Ok(())
            })
            .await?;
            anyhow::ensure!(ok, "an invariant does not hold (see above)");
            Ok(())
        }
        Command::Rules { command: rules::RulesCommand::Check { file, since, out } } => {
            rules::check(&operator_db().await?, &file, since, &out).await
        }
        Command::Pause { scope, reason, alarm_after, out } => {
            let actor = cli::operator(&config::Env::process());
            let by = Audit { actor: &actor, action: "pause", reason: &reason };
            pauses::pause(&operator_db().await?, &scope, alarm_after, &by, &out).await
        }
        Command::Resume { scope, reason, no_wait, out } => {
            let actor = cli::operator(&config::Env::process());
            let by = Audit { actor: &actor, action: "resume", reason: &reason };
            pauses::resume(&operator_db().await?, &scope, no_wait, &by, &out).await
        }
        Command::Pauses { history, out } => pauses::list(&operator_db().await?, history.as_deref(), &out).await,
        Command::Alerts { command, resolved, out } => {
            let pool = operator_db().await?;
            match command {
                None => alerts::list(&pool, resolved, &out).await,
                Some(command) => alerts::act(&pool, command, &cli::operator(&config::Env::process()), &out).await,
            }
        }
        Command::Jobs { command, limit, out } => {
            let actor = cli::operator(&config::Env::process());
            jobs::act(&operator_db().await?, command, limit, &actor, &out).await
        }
        Command::Archive { command } => archive::act(command).await,
        Command::Restore { source, dry_run, unverified, out } => {
            archive::restore(&operator_db().await?, &source, dry_run, unverified, &out).await
        }
        Command::Erase { selection, dry_run, at_most, reason, out } => {
            let actor = cli::operator(&config::Env::process());
            let by = Audit { actor: &actor, action: "erase", reason: &reason };
            let options = webhook_inbox::ops::EraseOptions { dry_run, at_most };
            erase::erase(&operator_db().await?, selection, options, &by, &out).await
        }
        Command::Stats { out } => events::stats(&operator_db().await?, &config::Env::resolved().await?, &out).await,
        Command::Providers { base_url, all, out } => {
            events::providers(&config::Env::resolved().await?, &base_url, all, &out)
        }
        Command::Failed { provider, since, limit, out } => {
            let filter = Filter { statuses: vec![Status::Failed], provider, since, ..Default::default() };
            events::failed(&operator_db().await?, &filter, limit.max(1), &out).await
        }
        Command::Events { provider, event_type, status, since, until, id, id_prefix, payload, after, limit, out } => {
            let event_id = id.map(IdMatch::Exact).or(id_prefix.map(IdMatch::Prefix));
            let query = EventQuery { provider, event_type, statuses: status, since, until, event_id, payload };
            events::events(&operator_db().await?, &query, after.as_ref(), limit, &out).await
        }
        Command::Show { provider, event_id, out } => {
            let env = config::Env::resolved().await?;
            events::show(&operator_db().await?, &env, &provider, &event_id, &out).await
        }
        Command::Replay { provider, event_id, reason, out } => {
            let actor = cli::operator(&config::Env::process());
            let by = Audit { actor: &actor, action: "replay", reason: &reason };
            requeue::replay(&operator_db().await?, &provider, &event_id, &by, &out).await
        }
        Command::Requeue {
            mut status,
            failed,
            provider,
            event_type,
            since,
            until,
            reason_like,
            dry_run,
            reason,
            out,
        } => {
            if failed && !status.contains(&Status::Failed) {
                status.push(Status::Failed);
            }
            let actor = cli::operator(&config::Env::process());
            let by = Audit { actor: &actor, action: "requeue", reason: &reason };
            let filter = Filter { statuses: status, provider, event_type, since, until, reason_like };
            requeue::requeue(&operator_db().await?, &filter, &by, dry_run, &out).await
        }
        Command::Outbox { command, dead, limit, out } => {
            outbox::act(&operator_db().await?, command, dead, limit, &out).await
        }
        Command::Migrate { stock } => passes::migrate(application(stock), stock).await,
    }
}

/// What `dev`, `serve` and `migrate` run: the stock application (its
/// handlers, its migrations) when asked, else the inbox alone, which makes no
/// table of the stock application's in a team's database.
fn application(stock: bool) -> webhook_inbox::App {
    if stock {
        stock::app()
    } else {
        webhook_inbox::App::default()
    }
}

/// The database of an operator's command, checked: set, reachable, migrated.
async fn operator_db() -> Result<sqlx::PgPool> {
    let config = DbConfig::read(&config::Env::resolved().await?, 1)?;
    let url = config.url.clone().context("DATABASE_URL is not set: the operator's commands work on a database")?;
    cli::connect(config.pool()?, &config::redact_url(&url)).await
}
