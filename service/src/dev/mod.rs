//! The local tooling: [`run`], the whole stack on one machine (what `inbox dev`
//! and a team's own `dev` binary are), on a throwaway PostgreSQL.

mod embedded_pg;

pub use embedded_pg::EmbeddedPostgres;

/// Where the PostgreSQL binaries of the throwaway cluster are (`initdb`,
/// `pg_ctl`, and `pgbench` beside them): `INBOX_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin`, else the folder of `initdb` on `PATH`.
pub fn postgres_bin_dir() -> Result<std::path::PathBuf> {
    embedded_pg::find_bin_dir()
}

/// `println!`, except that a closed stdout (`inbox dev | head`) is no panic.
macro_rules! say {
    ($($arg:tt)*) => {
        crate::runtime::say(&format!($($arg)*))
    };
}

use anyhow::{Context, Result};
use tokio::net::TcpListener;

use webhook_inbox::{
    config::{Env, Secrets},
    App, ReceiveConfig,
};

/// Runs the whole stack locally with `app`'s handlers and migrations, until
/// Ctrl-C or SIGTERM: `POST /webhooks/{provider}` on `host:port` (0 picks a
/// free port; the `ready` line names it), the worker, the relay when a sink is
/// set, prune hourly and reconcile every 15 minutes when configured, on
/// `DATABASE_URL` or a throwaway PostgreSQL of its own (removed on exit).
/// Without any webhook secret set it uses development secrets, and prints them.
///
/// A team's own `dev` binary is this one call:
///
/// ```no_run
/// # async fn app() -> webhook_inbox::App { webhook_inbox::App::default() }
/// #[tokio::main]
/// async fn main() -> anyhow::Result<()> {
///     webhook_inbox_service::dev::run(app().await, "127.0.0.1", 9000).await
/// }
/// ```
pub async fn run(app: App, host: &str, port: u16) -> Result<()> {
    webhook_inbox::config::init_logging();
    crate::runtime::keep_large_allocations_mapped();
    let host = host.to_string();
    // Read as the functions read it (Secrets Manager's `*_ARN` included), once.
    let env = Env::resolved().await?;
    let config = ReceiveConfig::read(&env, 16)?;
    let embedded = config.db.url.is_none();
    with_database(config, |mut config| async move { serve(&app, &env, &mut config, &host, port, embedded).await }).await
}

/// Runs `f` on DATABASE_URL, or on an embedded throwaway PostgreSQL that is removed afterwards.
pub async fn with_database<F, Fut>(mut config: ReceiveConfig, f: F) -> Result<()>
where
    F: FnOnce(ReceiveConfig) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let embedded = match &config.db.url {
        Some(url) => {
            say!("using DATABASE_URL {}", webhook_inbox::config::redact_url(url));
            None
        }
        None => {
            let pg = EmbeddedPostgres::start().await.context("starting the embedded PostgreSQL")?;
            say!("embedded PostgreSQL at {} (data in {}; removed on exit)", pg.url(), pg.data_dir().display());
            say!(
                "the operator's commands against it (inbox stats, failed, show, requeue): export DATABASE_URL={}",
                pg.url()
            );
            config.db.url = Some(pg.url());
            Some(pg)
        }
    };
    let result = f(config).await;
    if let Some(pg) = embedded {
        pg.destroy().await.context("stopping the embedded PostgreSQL")?;
        say!("embedded PostgreSQL stopped");
    }
    result
}

/// `embedded`: the database is the throwaway one [`with_database`] started.
async fn serve(
    app: &App,
    env: &Env<'_>,
    config: &mut ReceiveConfig,
    host: &str,
    port: u16,
    embedded: bool,
) -> Result<()> {
    let pool = config.db.pool()?;
    app.migrate(&pool).await.context("applying migrations")?;
    if config.secrets.none_configured() {
        config.secrets = Secrets::development();
        print_development_secrets();
    } else {
        let live: Vec<&str> = config
            .catalog
            .entries()
            .map(|e| e.provider)
            .filter(|p| config.secrets.is_configured(*p))
            .map(|p| p.as_str())
            .collect();
        say!("providers with a secret (each has a route; `inbox providers` for more): {}", live.join(", "));
    }
    let listener = TcpListener::bind((host, port)).await.with_context(|| format!("binding {host}:{port}"))?;
    // The console at /console, with an operator of its own whose password is new at each start:
    // `dev` on its own database; on DATABASE_URL a new name, never an existing user changed,
    // removed when it stops (and, if it is killed, expired after a day).
    let password = webhook_inbox_console::generate_password();
    let user =
        if embedded { "dev".to_string() } else { format!("dev-{}", &webhook_inbox_console::generate_password()[..8]) };
    let by = "inbox dev";
    webhook_inbox_console::add_expiring_user(
        &pool,
        &user,
        webhook_inbox_console::UserRole::Operator,
        &password,
        DEV_USER_LIFE,
        by,
    )
    .await
    .with_context(|| format!("adding the console user {user}"))?;
    let stack = crate::serve::Stack {
        app,
        env,
        config,
        pool: pool.clone(),
        roles: crate::serve::Roles::everything(),
        serve: crate::serve::ServeConfig::read(env)?,
        counted: true,
    };
    let served = stack
        .run(listener, None, crate::runtime::shutdown_signal(), |addr, _| {
            say!(
                "console: http://{addr}{}/  (sign in as {user}, password {password}; more users: inbox console user add)",
                webhook_inbox_console::PATH
            );
            say!("inbox dev ready: POST http://{addr}/webhooks/{{provider}}  (Ctrl-C stops)");
        })
        .await;
    let removed = webhook_inbox_console::remove_user(&pool, &user, by).await;
    served?;
    removed.with_context(|| format!("removing the console user {user}"))?;
    Ok(())
}

/// How long `inbox dev`'s console user lasts if `inbox dev` is killed before it can remove it.
const DEV_USER_LIFE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

fn print_development_secrets() {
    say!("no webhook secrets set: using development secrets");
    say!("  STRIPE_WEBHOOK_SECRET={}", webhook_inbox::config::DEV_STRIPE);
    say!("  SHOPIFY_WEBHOOK_SECRET={}", webhook_inbox::config::DEV_SHOPIFY);
    say!("  GITHUB_WEBHOOK_SECRET={}", webhook_inbox::config::DEV_GITHUB);
    say!("  STANDARD_WEBHOOK_SECRET={}", webhook_inbox::config::DEV_STANDARD);
    say!("  MARQETA_WEBHOOK_USERNAME={}", webhook_inbox::config::DEV_MARQETA_USERNAME);
    say!("  MARQETA_WEBHOOK_PASSWORD={}", webhook_inbox::config::DEV_MARQETA_PASSWORD);
}

/// A `Stripe-Signature` header as Stripe signs: `t=<t>,v1=<hex HMAC-SHA256
/// of "t.body" keyed by the whole secret>`, for sending signed deliveries to a
/// local stack (the demo's storm, the bench).
pub fn stripe_signature(secret: &str, t: u64, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}
