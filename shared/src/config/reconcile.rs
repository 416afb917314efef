//! Reconcile's settings and the provider APIs it reads.

use std::time::Duration;

use super::{invalid, ConfigError, Env};
use crate::{
    core::secret::Secret,
    reconcile::{ReconcileConfig, Reconciler, ShopifyOrders, StripeEvents},
};

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

impl Reconciler {
    /// Reads these settings from `env` (the variables are named on each field).
    pub fn read(env: &Env) -> Result<Self, ConfigError> {
        Ok(Reconciler::new(StripeEvents::read(env)?, ShopifyOrders::read(env)?, ReconcileConfig::read(env)?))
    }
}
