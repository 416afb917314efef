//! `inbox console user` and `inbox console token`: who may sign in to the
//! console, and who may call its management API.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use serde_json::json;
use sqlx::PgPool;
use webhook_inbox_console::{self as console, UserRole};

use crate::cli::{print_json, print_table, Output};

#[derive(Subcommand, Debug)]
pub(crate) enum ConsoleCommand {
    /// The console's users: who may sign in, as a viewer (reads) or an operator (also acts).
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// The management API's tokens (/api/v1, docs/api.md): a viewer's reads, an operator's also acts.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum TokenCommand {
    /// Make a token; it is printed once (only its hash is kept).
    Add {
        /// Who calls with it (the audit names it api:NAME).
        name: String,
        /// viewer (reads everything, acts on nothing) or operator (also replays, requeues, erases).
        #[arg(long, value_parser = parse_role)]
        role: UserRole,
        #[command(flatten)]
        out: Output,
    },
    /// Revoke a token, at once.
    Revoke {
        name: String,
        #[command(flatten)]
        out: Output,
    },
    /// Every token, with its role and last use.
    List {
        #[command(flatten)]
        out: Output,
    },
}

/// `inbox console token ...`, each change audited as `by`'s.
async fn console_token(pool: &PgPool, command: TokenCommand, by: &str) -> Result<()> {
    match command {
        TokenCommand::Add { name, role, out } => {
            let token = console::add_token(pool, &name, role, by).await?;
            // The one place it is ever shown: it is kept only as its hash.
            if out.json {
                print_json(&json!({"name": name, "role": role.to_string(), "token": token}));
            } else {
                say!("{name} added, {role}");
                say!("token (shown once, kept only as its hash): {token}");
            }
            Ok(())
        }
        TokenCommand::Revoke { name, out } => {
            if !console::revoke_token(pool, &name, by).await? {
                bail!("no live API token {name:?}");
            }
            done(&out, &name, "revoked");
            Ok(())
        }
        TokenCommand::List { out } => {
            let tokens = console::list_tokens(pool).await?;
            if out.json {
                print_json(&json!({ "tokens": tokens }));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = tokens
                .iter()
                .map(|t| {
                    vec![
                        t.name.clone(),
                        t.role.clone(),
                        t.created_at.clone(),
                        t.last_used_at.clone().unwrap_or_else(|| "never".into()),
                        t.revoked_at.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            print_table(&["name", "role", "added", "last used", "revoked"], &rows);
            Ok(())
        }
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum UserCommand {
    /// Add a user. Without --password-stdin a password is made and printed, once.
    Add {
        name: String,
        /// viewer (reads everything, acts on nothing) or operator (also replays, requeues, retries).
        #[arg(long, value_parser = parse_role)]
        role: UserRole,
        /// Read the password from stdin (its first line; at least 12 characters).
        #[arg(long)]
        password_stdin: bool,
        #[command(flatten)]
        out: Output,
    },
    /// Remove a user, and sign it out everywhere.
    Remove {
        name: String,
        #[command(flatten)]
        out: Output,
    },
    /// Every user, with its role and sessions.
    List {
        #[command(flatten)]
        out: Output,
    },
}

fn parse_role(name: &str) -> Result<UserRole, String> {
    UserRole::parse(name.trim()).ok_or_else(|| format!("{name:?} is not a role: viewer or operator"))
}

/// `inbox console user ...`, each change audited as `by`'s.
async fn console_user(pool: &PgPool, command: UserCommand, by: &str) -> Result<()> {
    match command {
        UserCommand::Add { name, role, password_stdin, out } => {
            let (password, made) = if password_stdin {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).context("reading the password from stdin")?;
                (line.trim_end_matches(['\r', '\n']).to_string(), false)
            } else {
                (console::generate_password(), true)
            };
            console::add_user(pool, &name, role, &password, by).await?;
            // A password made here is shown once, here: it is kept only as its hash.
            let shown = made.then_some(password.as_str());
            if out.json {
                print_json(&json!({"name": name, "role": role.to_string(), "password": shown}));
            } else {
                say!("{name} added, {role}");
                if let Some(password) = shown {
                    say!("password (shown once, kept only as its hash): {password}");
                }
            }
            Ok(())
        }
        UserCommand::Remove { name, out } => {
            if !console::remove_user(pool, &name, by).await? {
                bail!("no console user {name:?}");
            }
            done(&out, &name, "removed, and signed out everywhere");
            Ok(())
        }
        UserCommand::List { out } => {
            let users = console::list_users(pool).await?;
            if out.json {
                print_json(&json!({ "users": users }));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = users
                .iter()
                .map(|u| vec![u.name.clone(), u.role.to_string(), u.created_at.clone(), u.sessions.to_string()])
                .collect();
            print_table(&["name", "role", "added", "sessions"], &rows);
            Ok(())
        }
    }
}

/// What a removal or a revocation says: `{"name": ..., "done": ...}` with `--json`.
fn done(out: &Output, name: &str, what: &str) {
    if out.json {
        print_json(&json!({"name": name, "done": what}));
    } else {
        say!("{name} {what}");
    }
}

/// `inbox console user|token ...`, as the operator (`INBOX_OPERATOR`).
pub(crate) async fn act(pool: &PgPool, command: ConsoleCommand) -> Result<()> {
    let by = crate::cli::operator(&webhook_inbox::config::Env::process());
    match command {
        ConsoleCommand::User { command } => console_user(pool, command, &by).await,
        ConsoleCommand::Token { command } => console_token(pool, command, &by).await,
    }
}
