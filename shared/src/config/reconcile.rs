//! Reconcile's settings and the provider APIs it reads.

use std::time::Duration;

use sqlx::PgPool;

use super::{invalid, ConfigError, Env};
use crate::{
    app::App,
    reconcile::{GithubDeliveries, Hook, ReconcileConfig, Reconciler, ShopifyOrders, StripeEvents},
};
use webhook_inbox_schemes::secret::Secret;

impl ReconcileConfig {
    /// `RECONCILE_LOOKBACK_HOURS` (72), `RECONCILE_WINDOW_MINUTES` (60).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        let window = env.parse("RECONCILE_WINDOW_MINUTES", 60u64)?;
        if window == 0 {
            return Err(invalid("RECONCILE_WINDOW_MINUTES", "must be at least 1"));
        }
        Ok(ReconcileConfig {
            first_lookback: Duration::from_secs(3600 * env.parse("RECONCILE_LOOKBACK_HOURS", 72u64)?),
            overlap: Duration::from_secs(300),
            window: Duration::from_secs(60 * window),
        })
    }
}

impl StripeEvents {
    /// `STRIPE_API_KEY` (none: no Stripe reconciliation), `STRIPE_API_BASE`.
    pub fn read(env: &Env) -> Result<Option<Self>, ConfigError> {
        let Some(key) = env.var("STRIPE_API_KEY") else {
            return Ok(None);
        };
        let base = env.var("STRIPE_API_BASE").unwrap_or_else(|| "https://api.stripe.com".into());
        Self::new(base, Secret::new(key)).map(Some)
    }
}

impl ShopifyOrders {
    /// `SHOPIFY_SHOP_DOMAIN` and `SHOPIFY_ACCESS_TOKEN` (both, or no Shopify
    /// reconciliation), `SHOPIFY_API_BASE` (`https://<domain>`), `SHOPIFY_API_VERSION` (2024-10).
    pub fn read(env: &Env) -> Result<Option<Self>, ConfigError> {
        let (Some(token), Some(domain)) = (env.var("SHOPIFY_ACCESS_TOKEN"), env.var("SHOPIFY_SHOP_DOMAIN")) else {
            return Ok(None);
        };
        let base = env.var("SHOPIFY_API_BASE").unwrap_or_else(|| format!("https://{domain}"));
        let version = env.var("SHOPIFY_API_VERSION").unwrap_or_else(|| "2024-10".into());
        Self::new(base, version, Secret::new(token)).map(Some)
    }
}

impl GithubDeliveries {
    /// `GITHUB_API_TOKEN` (none: no GitHub reconciliation), `GITHUB_API_BASE`
    /// (`https://api.github.com`), `GITHUB_HOOKS` (comma-separated; required
    /// with the token): one source per hook.
    pub fn read(env: &Env) -> Result<Vec<Self>, ConfigError> {
        let Some(token) = env.var("GITHUB_API_TOKEN") else {
            return Ok(Vec::new());
        };
        let base = env.var("GITHUB_API_BASE").unwrap_or_else(|| "https://api.github.com".into());
        let hooks = env.var("GITHUB_HOOKS").unwrap_or_default();
        let hooks: Vec<Hook> = hooks
            .split(',')
            .filter(|h| !h.trim().is_empty())
            .map(|h| Hook::parse(h).map_err(|reason| invalid("GITHUB_HOOKS", reason)))
            .collect::<Result<_, _>>()?;
        if hooks.is_empty() {
            return Err(invalid(
                "GITHUB_HOOKS",
                "GITHUB_API_TOKEN is set but no hook is named: repos/<owner>/<repo>/hooks/<id>, orgs/<org>/hooks/<id> or app",
            ));
        }
        let token = Secret::new(token);
        hooks.into_iter().map(|hook| Self::new(base.clone(), token.clone(), hook)).collect()
    }
}

impl Reconciler {
    /// The sources configured in `env` (Stripe, Shopify, each GitHub hook;
    /// the variables are named on each), then `app`'s own ([`App::with_source`]),
    /// on `pool`.
    pub fn read(env: &Env, app: &App, pool: PgPool) -> Result<Self, ConfigError> {
        let mut reconciler = Reconciler::new(pool, ReconcileConfig::read(env)?);
        if let Some(stripe) = StripeEvents::read(env)? {
            reconciler = reconciler.with_source(std::sync::Arc::new(stripe));
        }
        if let Some(shopify) = ShopifyOrders::read(env)? {
            reconciler = reconciler.with_source(std::sync::Arc::new(shopify));
        }
        for hook in GithubDeliveries::read(env)? {
            reconciler = reconciler.with_source(std::sync::Arc::new(hook));
        }
        Ok(app.sources().iter().fold(reconciler, |r, source| r.with_source(source.clone())))
    }
}
