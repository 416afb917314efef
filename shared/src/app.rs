//! What a team builds its binaries from: its handlers and its migrations.

use std::sync::Arc;

use sqlx::{migrate::Migrator, PgPool};
use webhook_inbox_schemes::Scheme;

use crate::{db::schema, process::handlers::Handlers, receive::receiver::Receiver};

/// A team's application: the handlers its events run through, and the sqlx
/// migrations of its own tables. Every stage's entry point takes one, so the
/// `process` function, inline mode and `dev` run the same handlers, and the
/// `migrate` function applies the same migrations.
///
/// The stock binaries are built from such an application too: the `stock`
/// crate of the repository (`examples/stock`).
#[derive(Clone, Default)]
pub struct App {
    handlers: Handlers,
    /// The application's migrations, and the table of their history (none: sqlx's `_sqlx_migrations`).
    migrations: Option<(&'static Migrator, Option<&'static str>)>,
    schemes: Vec<Arc<dyn Scheme>>,
    #[cfg(feature = "reconcile")]
    sources: Vec<Arc<dyn crate::reconcile::Source>>,
    #[cfg(feature = "relay")]
    sinks: Vec<(String, Arc<dyn crate::relay::Sink>)>,
    apis: crate::process::hints::Apis,
}

impl App {
    /// An application with these handlers and no migrations of its own.
    pub fn new(handlers: Handlers) -> Self {
        App { handlers, ..App::default() }
    }

    /// The application's own migrations (`sqlx::migrate!()`), applied after
    /// the inbox's. They keep their history in sqlx's `_sqlx_migrations`, the
    /// inbox in its own table, so neither refuses the other.
    pub fn with_migrations(mut self, migrations: &'static Migrator) -> Self {
        self.migrations = Some((migrations, None));
        self
    }

    /// [`App::with_migrations`], their history kept in `history_table` (made
    /// if missing) instead of `_sqlx_migrations`: for migrations that must not
    /// meet a team's own sqlx history (the stock application's), or an
    /// application whose `_sqlx_migrations` belongs to another tool. The name
    /// is a plain lowercase identifier, neither the inbox's history table nor
    /// sqlx's; [`App::migrate`] refuses any other before it changes anything.
    pub fn with_migrations_in(mut self, migrations: &'static Migrator, history_table: &'static str) -> Self {
        self.migrations = Some((migrations, Some(history_table)));
        self
    }

    /// A provider's signing contract in code ([`crate::schemes`]), for a
    /// provider neither built in nor declarable as data, with the secrets it
    /// was given: `POST /webhooks/{name}` verifies by it. A scheme of a name
    /// the inbox already knows replaces the built-in one.
    pub fn with_scheme(mut self, scheme: impl Scheme + 'static) -> Self {
        self.schemes.push(Arc::new(scheme));
        self
    }

    /// A provider API of its own for reconcile to read (see
    /// [`crate::reconciliation::Source`]), besides the built-in ones the
    /// environment configures: the `reconcile` function, `inbox serve` and
    /// `inbox reconcile` built from this app run it.
    #[cfg(feature = "reconcile")]
    pub fn with_source(mut self, source: impl crate::reconcile::Source + 'static) -> Self {
        self.sources.push(Arc::new(source));
        self
    }

    /// A sink of its own ([`crate::sinks::Sink`]) under `name`: a destination
    /// of `RELAY_DESTINATIONS_FILE` with `sink = "name"` sends to it, in the
    /// `relay` function, `inbox serve` and `inbox relay` built from this app.
    /// A later sink of the same name replaces an earlier one.
    #[cfg(feature = "relay")]
    pub fn with_sink(mut self, name: impl Into<String>, sink: impl crate::relay::Sink) -> Self {
        let name = name.into();
        self.sinks.retain(|(n, _)| *n != name);
        self.sinks.push((name, Arc::new(sink)));
        self
    }

    #[cfg(feature = "relay")]
    pub(crate) fn sink(&self, name: &str) -> Option<Arc<dyn crate::relay::Sink>> {
        self.sinks.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone())
    }

    #[cfg(feature = "relay")]
    pub(crate) fn sink_names(&self) -> Vec<String> {
        self.sinks.iter().map(|(n, _)| n.clone()).collect()
    }

    /// `api` to fetch `provider`'s objects from, for hint handlers
    /// ([`crate::hints::HintHandler`]); Stripe's ([`crate::hints::StripeApi`])
    /// comes from `STRIPE_API_KEY` without it.
    pub fn with_api(mut self, provider: crate::Provider, api: impl crate::hints::ObjectApi + 'static) -> Self {
        self.apis = self.apis.with(provider, Arc::new(api));
        self
    }

    pub(crate) fn apis(&self) -> &crate::process::hints::Apis {
        &self.apis
    }

    #[cfg(feature = "reconcile")]
    pub(crate) fn sources(&self) -> &[Arc<dyn crate::reconcile::Source>] {
        &self.sources
    }

    /// The handlers.
    pub fn handlers(&self) -> &Handlers {
        &self.handlers
    }

    /// Applies the inbox's pending migrations, then the application's, each
    /// set in one transaction; returns the inbox's latest version.
    pub async fn migrate(&self, pool: &PgPool) -> Result<i64, schema::MigrateError> {
        if let Some((_, Some(table))) = self.migrations {
            if let Some(why) = schema::history_table_refused(table) {
                return Err(schema::MigrateError::HistoryTable(table, why));
            }
        }
        let version = schema::migrate(pool).await?;
        match self.migrations {
            Some((set, Some(table))) => schema::migrate_own(pool, set, table).await?,
            Some((set, None)) => schema::migrate_app(pool, set).await?,
            None => {}
        }
        Ok(version)
    }
}

impl App {
    /// The migrations not applied yet (the inbox's, then the application's),
    /// each as `version description`; empty when the schema is up to date
    /// (what `inbox serve`'s `/readyz` waits for).
    pub async fn pending_migrations(&self, pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
        let mut pending = schema::pending(pool, &schema::MIGRATIONS, schema::HISTORY_TABLE).await?;
        if let Some((set, table)) = self.migrations {
            if let Some((table, why)) = table.and_then(|t| Some((t, schema::history_table_refused(t)?))) {
                return Err(sqlx::Error::Configuration(format!("{table:?} as a history table: {why}").into()));
            }
            pending.extend(schema::pending(pool, set, table.unwrap_or("_sqlx_migrations")).await?);
        }
        Ok(pending)
    }
}

impl Receiver {
    /// `app`'s handlers (for inline mode) and its own schemes ([`App::with_scheme`]).
    pub fn with_app(self, app: &App) -> Self {
        self.with_schemes(&app.schemes).with_handlers(app.handlers.clone())
    }
}
