//! The inbox's migrations against a real, empty database, through the public
//! API ([`App::migrate`]): all or nothing, beside a team's in either order,
//! and from release 0.1.0. The `migrate` function's custom resource (every
//! request answered, the schema applied once, Delete never touching the
//! database) is driven through its own binary in `functions/migrate/tests/`.

use std::time::Duration;

use inbox_tests::history::{applied, sqlx_history, stock_history, tables};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgPool,
};
use webhook_inbox::{App, MigrateError};
use webhook_inbox_migrations::INBOX as MIGRATIONS;

/// What the `migrate` function applies with no application of its own: the inbox's migrations.
async fn migrate_inbox(pool: &PgPool) -> Result<i64, MigrateError> {
    App::default().migrate(pool).await
}

fn versions(m: &sqlx::migrate::Migrator) -> Vec<i64> {
    m.iter().map(|m| m.version).collect()
}

/// A team's own sqlx migrations: one dated before the inbox's, one after.
static TEAM: sqlx::migrate::Migrator = sqlx::migrate!("./data/team-migrations");
/// The migrations as release 0.1.0 shipped them, applied as it applied them:
/// this release's files up to its last, except the one it changed since
/// (release 0.1.0's copy in tests/data), each pinned by 0.1.0's checksum.
static RELEASE_0_1_0: std::sync::LazyLock<sqlx::migrate::Migrator> = std::sync::LazyLock::new(|| {
    use sqlx::migrate::{Migration, MigrationType, Migrator};
    const PROCESS: &str = include_str!("../data/release-0.1.0-migrations/20261129000002_process.sql");
    // sha384sum of each file as release 0.1.0 shipped it.
    const SHIPPED: [(i64, &str); 7] = [
        (
            20261129000001,
            "040dd4d1ce54f0b7e65062a84ad15e228b264f891703ebd827d6aab5187d760aff3ca8299ba1e7cded12a8330b7ea8b3",
        ),
        (
            20261129000002,
            "a191811eb9a52b60555955eaf6af3ec1f69bf5dadc922d87c417aa1f91ad3701d7f3eccbc149ffb866fa9db7cce15d6f",
        ),
        (
            20261129000003,
            "c0aade060fabb86f4fdd601f2490346c1f7ca88e2f2a89075f126c1b3cb46cc11bee196cf459f6483ae041023a0a7243",
        ),
        (
            20261129000004,
            "5c5cbe787abc527a6df486e047db7d93fe0cd43f89c2dcc4947b3d6c4785ed219a210c74a08df1ebef7f4638a40b933b",
        ),
        (
            20261129000005,
            "00cbc57573b79f6be2a5c4143ce4329e051f3bb70d7991f6c6cfb41be6816b070335916544ff4b7b7de8a6cb7d4ccfc9",
        ),
        (
            20261130000001,
            "6776bec2ac11f244fd5bdf983888adb8e2a4d1ab8620b8313b50072c74eb9990d050710dc29f05c37434ede30561c269",
        ),
        (
            20261201000001,
            "5f8370800b3dd34621bcd18ef9f50738299f3a5f2d3524e9dec7e1236e5bc90fd792129a2126441a92d4731d84293e3e",
        ),
    ];
    let migrations: Vec<Migration> = SHIPPED
        .iter()
        .map(|(version, sum)| {
            let now = MIGRATIONS.iter().find(|m| m.version == *version).expect("still a migration of ours");
            let sql = if *version == 20261129000002 { PROCESS.into() } else { now.sql.clone() };
            let m = Migration::new(*version, now.description.clone(), MigrationType::Simple, sql, false);
            assert_eq!(hex::encode(&*m.checksum), *sum, "migration {version} is not as release 0.1.0 shipped it");
            m
        })
        .collect();
    Migrator { migrations: migrations.into(), ..Migrator::DEFAULT }
});

/// Our migrations apply all or nothing, and take the lock `sqlx migrate run`
/// takes: neither applies half of the other's work.
#[sqlx::test(migrations = false)]
async fn migrations_apply_all_or_nothing_and_wait_for_sqlx_s_lock(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    use sqlx::{migrate::Migrate, Connection};
    let pool = pool_options.connect_lazy_with(options.clone());

    // The last migration's table exists already: that migration fails, and takes the others with it.
    sqlx::query("CREATE TABLE inbox_audit (id int)").execute(&pool).await.unwrap();
    let err = migrate_inbox(&pool).await.unwrap_err();
    assert!(err.to_string().contains("inbox_audit"), "{err}");
    let tables: Vec<String> = sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(tables, ["inbox_audit"], "only the table made by hand is there (not even the history)");
    sqlx::query("DROP TABLE inbox_audit").execute(&pool).await.unwrap();

    let mut sqlx_cli = sqlx::PgConnection::connect_with(&options).await.unwrap();
    sqlx_cli.lock().await.unwrap();
    let ours = tokio::spawn({
        let pool = pool.clone();
        async move { migrate_inbox(&pool).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!ours.is_finished(), "migrated while sqlx's lock was held");
    sqlx_cli.unlock().await.unwrap();
    ours.await.unwrap().unwrap();
    assert_eq!(applied(&pool).await, MIGRATIONS.iter().count() as i64);
}

#[sqlx::test(migrations = false)]
async fn the_inbox_s_migrations_make_no_stock_table(pool_options: PgPoolOptions, options: PgConnectOptions) {
    let pool = pool_options.connect_lazy_with(options);
    migrate_inbox(&pool).await.unwrap();
    let tables = tables(&pool).await;
    for domain in ["orders", "payments", "accounts", "account_deposits"] {
        assert!(!tables.iter().any(|t| t == domain), "{domain} in {tables:?}");
    }
    assert!(tables.iter().any(|t| t == "webhook_inbox"), "{tables:?}");
    assert!(!tables.iter().any(|t| t == "_sqlx_migrations"), "sqlx's history is left to the team: {tables:?}");

    // The stock application's tables come with the stock application only.
    stock::app().migrate(&pool).await.unwrap();
    let tables = self::tables(&pool).await;
    for domain in ["orders", "payments", "accounts", "account_deposits"] {
        assert!(tables.iter().any(|t| t == domain), "{domain} in {tables:?}");
    }
}

/// A team runs its own sqlx migrator (its `_sqlx_migrations`) before ours,
/// after ours, and through `App::with_migrations`: nobody refuses anybody.
#[sqlx::test(migrations = false)]
async fn a_team_s_sqlx_migrations_and_the_inbox_s_run_in_either_order(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = pool_options.connect_lazy_with(options);
    // The team first, as `sqlx migrate run` or its own `MIGRATOR.run` would; then the inbox's.
    TEAM.run(&pool).await.unwrap();
    migrate_inbox(&pool).await.unwrap();
    // Then each again, in the other order: nothing pending, nothing refused.
    TEAM.run(&pool).await.unwrap();
    migrate_inbox(&pool).await.unwrap();
    TEAM.run(&pool).await.unwrap();
    assert_eq!(sqlx_history(&pool).await, versions(&TEAM));
    assert_eq!(applied(&pool).await, MIGRATIONS.iter().count() as i64);

    // The other order on a fresh schema of the same database: the inbox's first, then the team's.
    let pool = fresh_schema(&pool, "inbox_first").await;
    App::default().with_migrations(&TEAM).migrate(&pool).await.unwrap();
    TEAM.run(&pool).await.unwrap();
    migrate_inbox(&pool).await.unwrap();
    assert_eq!(sqlx_history(&pool).await, versions(&TEAM));
    assert_eq!(applied(&pool).await, MIGRATIONS.iter().count() as i64);
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices").fetch_one(&pool).await.unwrap();
    assert_eq!(invoices, 0);

    // Even the stock binaries run on it (a team's database once deployed with them, or `inbox dev`
    // pointed at it): their stock application keeps its history to itself, and the team's still runs.
    stock::app().migrate(&pool).await.unwrap();
    TEAM.run(&pool).await.unwrap();
    assert_eq!(sqlx_history(&pool).await, versions(&TEAM));
}

/// `App::with_migrations_in`: an application's migrations with their history in
/// a table of its own (as the stock application keeps its), never in sqlx's;
/// a name that is not a plain identifier, or is the inbox's or sqlx's own
/// history, is refused before anything is applied.
#[sqlx::test(migrations = false)]
async fn an_application_keeps_its_history_in_a_table_of_its_own_and_only_a_safe_one(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = pool_options.connect_lazy_with(options);
    for bad in ["webhook_inbox_migrations", "_sqlx_migrations", "x; DROP TABLE webhook_inbox", "Billing", "", "a-b"] {
        let app = App::default().with_migrations_in(&TEAM, bad);
        let err = app.migrate(&pool).await.unwrap_err();
        assert!(matches!(err, MigrateError::HistoryTable(..)), "{bad:?}: {err}");
        assert!(app.pending_migrations(&pool).await.is_err(), "{bad:?}");
    }
    assert!(tables(&pool).await.is_empty(), "nothing applied: {:?}", tables(&pool).await);

    let app = App::default().with_migrations_in(&TEAM, "billing_migrations");
    assert_eq!(app.pending_migrations(&pool).await.unwrap().len(), MIGRATIONS.iter().count() + versions(&TEAM).len());
    app.migrate(&pool).await.unwrap();
    app.migrate(&pool).await.unwrap();
    assert!(app.pending_migrations(&pool).await.unwrap().is_empty());
    let recorded: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM billing_migrations ORDER BY version").fetch_all(&pool).await.unwrap();
    assert_eq!(recorded, versions(&TEAM));
    assert!(!tables(&pool).await.iter().any(|t| t == "_sqlx_migrations"), "sqlx's history untouched");
}

/// A pool whose sessions work in a schema of their own (created empty).
async fn fresh_schema(pool: &PgPool, schema: &str) -> PgPool {
    sqlx::raw_sql(&format!("CREATE SCHEMA {schema}")).execute(pool).await.unwrap();
    let options = pool.connect_options().as_ref().clone().options([("search_path", schema)]);
    PgPoolOptions::new().max_connections(2).connect_lazy_with(options)
}

/// A database migrated by release 0.1.0 (the inbox's history in
/// `_sqlx_migrations`, with a team's interleaved, as `set_ignore_missing`
/// let it): the upgrade moves the inbox's history, runs nothing again, loses
/// no row, and the team's migrator then runs without ignoring anything.
#[sqlx::test(migrations = false)]
async fn a_database_migrated_by_release_0_1_0_upgrades_without_running_anything_again(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = pool_options.connect_lazy_with(options);
    RELEASE_0_1_0.run(&pool).await.unwrap();
    let mut team_then = sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate::Migrator::DEFAULT };
    team_then.migrations = TEAM.migrations[..1].to_vec().into();
    team_then.run(&pool).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, raw_body, secret_index, status, processed_at)
         VALUES ('stripe', 'evt_kept', 'payment_intent.succeeded', '{}', '\\x7b7d', 0, 'done', now());
         INSERT INTO payments (payment_id, amount, currency, stripe_event_id) VALUES ('pi_kept', 100, 'usd', 'evt_kept');
         INSERT INTO invoices (invoice_id) VALUES ('in_kept');",
    )
    .execute(&pool)
    .await
    .unwrap();

    let installed = |table: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (i64, String)>(&format!(
                "SELECT version, installed_on::text FROM {table} WHERE version = ANY($1) ORDER BY version"
            ))
            .bind(versions(&RELEASE_0_1_0))
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    let before = installed("_sqlx_migrations").await;
    assert_eq!(before.len(), RELEASE_0_1_0.iter().count());

    // The team's migrator refuses the history as release 0.1.0 left it...
    let refused = TEAM.run(&pool).await.unwrap_err();
    assert!(matches!(refused, sqlx::migrate::MigrateError::VersionMissing(_)), "{refused}");
    // ...and the upgrade, the team's application migrating, moves the inbox's rows out of its way.
    App::default().with_migrations(&TEAM).migrate(&pool).await.unwrap();
    assert_eq!(applied(&pool).await, MIGRATIONS.iter().count() as i64);
    assert_eq!(sqlx_history(&pool).await, versions(&TEAM), "the team's rows alone");
    TEAM.run(&pool).await.unwrap();
    migrate_inbox(&pool).await.unwrap();

    let kept: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhook_inbox WHERE event_id = 'evt_kept'),
                (SELECT count(*) FROM payments WHERE payment_id = 'pi_kept'),
                (SELECT count(*) FROM invoices WHERE invoice_id = 'in_kept' AND paid_at IS NULL)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(kept, (1, 1, 1));
    // The release's migrations keep when they ran: moved, not run again.
    assert_eq!(installed("webhook_inbox_migrations").await, before);
}

/// The stock deployment of release 0.1.0 upgrades too: the stock
/// application's tables, made by the inbox's migrations then, are kept with their
/// rows, and its own migration is recorded in sqlx's history.
#[sqlx::test(migrations = false)]
async fn a_stock_database_of_release_0_1_0_keeps_its_stock_tables(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = pool_options.connect_lazy_with(options);
    RELEASE_0_1_0.run(&pool).await.unwrap();
    sqlx::query("INSERT INTO accounts (account_id, balance) VALUES ('acct_kept', 12.50)").execute(&pool).await.unwrap();
    let app = stock::app();
    app.migrate(&pool).await.unwrap();
    app.migrate(&pool).await.unwrap();
    assert_eq!(applied(&pool).await, MIGRATIONS.iter().count() as i64);
    assert_eq!(stock_history(&pool).await, versions(&stock::MIGRATIONS));
    assert_eq!(sqlx_history(&pool).await, Vec::<i64>::new(), "release 0.1.0's rows moved out, nothing added");
    let balance: String = sqlx::query_scalar("SELECT balance::text FROM accounts WHERE account_id = 'acct_kept'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(balance, "12.50");
}

#[sqlx::test(migrations = false)]
async fn an_inbox_migration_applied_with_other_contents_is_refused(
    pool_options: PgPoolOptions,
    options: PgConnectOptions,
) {
    let pool = pool_options.connect_lazy_with(options);
    migrate_inbox(&pool).await.unwrap();
    let first = MIGRATIONS.iter().next().unwrap().version;
    sqlx::query("UPDATE webhook_inbox_migrations SET checksum = '\\x00' WHERE version = $1")
        .bind(first)
        .execute(&pool)
        .await
        .unwrap();
    let err = migrate_inbox(&pool).await.unwrap_err();
    assert!(matches!(err, MigrateError::Modified(v) if v == first), "{err}");

    sqlx::query("INSERT INTO webhook_inbox_migrations (version, description, checksum, execution_time) VALUES (29991231000000, 'from the future', '\\x00', 0)")
        .execute(&pool)
        .await
        .unwrap();
    let err = migrate_inbox(&pool).await.unwrap_err();
    assert!(matches!(err, MigrateError::Unknown(29991231000000)), "{err}");
}
