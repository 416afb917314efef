//! The SQL of the inbox's tables, one file per migration in this folder (the
//! repository's top-level `migrations/`), embedded as an sqlx [`Migrator`].
//! The `webhook-inbox` crate applies them with its own history table
//! (`webhook_inbox_migrations`), never sqlx's: run them through it
//! (`inbox migrate`, the `migrate` function, `App::migrate`), not with
//! `sqlx migrate run`.
//!
//! `optional/` holds what a deployment may choose instead, applied by hand:
//! [`HASH_PARTITIONED_INBOX`].

#![deny(missing_docs)]

use sqlx::migrate::Migrator;

/// Every migration of the inbox's tables, in version order.
// This folder itself: sqlx's macro refuses a path without a parent (".", "./"),
// so it names a child and goes back up.
pub static INBOX: Migrator = sqlx::migrate!("./optional/..");

/// `webhook_inbox` hash-partitioned on its key `(provider, event_id)`, for when
/// partition-level maintenance (VACUUM, reindex, moving partitions) matters
/// more than a few microseconds per claim: applied once, after [`INBOX`].
pub const HASH_PARTITIONED_INBOX: &str = include_str!("optional/hash_partitioned_inbox.sql");
