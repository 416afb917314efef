//! What a transaction pooler (PgBouncer in `pool_mode = transaction`, RDS
//! Proxy) asks of a client: a client's next transaction may run on another
//! server session, so nothing may outlive a transaction.
//!
//! - Statements are built with [`query`], [`query_as`] and [`query_scalar`]:
//!   prepared by name and kept per connection when the process talks to
//!   PostgreSQL itself, unnamed behind a pooler (a name prepared on one server
//!   is missing on the next, 26000, or already taken there, 42P05).
//! - A statement outside a transaction goes through [`Autocommit`]: sent as is,
//!   or, behind a pooler, between `BEGIN` and `COMMIT`, because sqlx parses and
//!   executes it in two exchanges that a pooler may send to two servers.
//! - Advisory locks are transaction-scoped (`pg_advisory_xact_lock`), and the
//!   migrations run in one transaction (`super::schema`).
//! - No startup parameter is sent ([`super::DbConfig::behind_proxy`]).

use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::{future::BoxFuture, stream::BoxStream, StreamExt, TryStreamExt};
use sqlx::{
    postgres::{PgArguments, PgQueryResult, PgRow, PgStatement, PgTypeInfo},
    query::{Query, QueryAs, QueryScalar},
    Acquire, Describe, Either, Execute, Executor, FromRow, Postgres,
};

static UNNAMED: AtomicBool = AtomicBool::new(false);

/// Set once, where the database configuration is read (`INBOX_DB_POOLER=proxy`):
/// a process talks to one database, through a pooler or not (and the
/// statements of a process that does both are simply unnamed everywhere).
pub(crate) fn set_behind_pooler() {
    UNNAMED.store(true, Ordering::Relaxed);
}

fn named() -> bool {
    !UNNAMED.load(Ordering::Relaxed)
}

/// `sqlx::query`, unnamed behind a pooler. Handlers use it too.
pub fn query(sql: &str) -> Query<'_, Postgres, PgArguments> {
    #[allow(clippy::disallowed_methods)]
    sqlx::query(sql).persistent(named())
}

/// `sqlx::query_as`, unnamed behind a pooler.
pub fn query_as<'q, O>(sql: &'q str) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    #[allow(clippy::disallowed_methods)]
    sqlx::query_as(sql).persistent(named())
}

/// `sqlx::query_scalar`, unnamed behind a pooler.
pub fn query_scalar<'q, O>(sql: &'q str) -> QueryScalar<'q, Postgres, O, PgArguments>
where
    (O,): for<'r> FromRow<'r, PgRow>,
{
    #[allow(clippy::disallowed_methods)]
    sqlx::query_scalar(sql).persistent(named())
}

/// A statement built with a [`sqlx::QueryBuilder`] (one text per combination
/// of filters, each planned for what it filters on), unnamed behind a pooler.
pub(crate) fn built_query_as<'q, O>(
    builder: &'q mut sqlx::QueryBuilder<'_, Postgres>,
) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    builder.build_query_as().persistent(named())
}

/// One statement as its own transaction, on a pool or a connection.
#[derive(Debug)]
pub struct Autocommit<A>(pub A);

impl<'c, A> Executor<'c> for Autocommit<A>
where
    A: Executor<'c, Database = Postgres> + Acquire<'c, Database = Postgres> + 'c,
{
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if named() {
            return self.0.fetch_many(query);
        }
        // Collected before COMMIT: nothing reaches the caller that is not committed.
        let all = async move {
            let mut tx = self.0.begin().await?;
            let all: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(futures_util::stream::iter(all.into_iter().map(Ok)))
        };
        futures_util::stream::once(all).try_flatten().boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if named() {
            return self.0.fetch_optional(query);
        }
        Box::pin(async move {
            let mut tx = self.0.begin().await?;
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.0.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(self, sql: &'q str) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.0.describe(sql)
    }
}
