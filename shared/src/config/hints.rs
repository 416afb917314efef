//! The APIs the worker fetches hint handlers' objects from.

use super::{ConfigError, Env};
use crate::{app::App, process::hints::Apis};

impl Apis {
    /// Stripe's (`STRIPE_API_KEY`, `STRIPE_API_BASE`; in a build with the
    /// `http-client` feature), then `app`'s own ([`App::with_api`]).
    pub fn read(env: &Env, app: &App) -> Result<Self, ConfigError> {
        #[allow(unused_mut)]
        let mut apis = Apis::default();
        #[cfg(feature = "http-client")]
        if let Some(key) = env.var("STRIPE_API_KEY") {
            let base = env.var("STRIPE_API_BASE").unwrap_or_else(|| "https://api.stripe.com".into());
            let stripe = crate::process::hints::StripeApi::new(base, super::Secret::new(key)).map_err(|e| {
                ConfigError::Invalid {
                    var: "STRIPE_API_KEY".into(),
                    reason: format!("cannot build an HTTP client: {e}"),
                }
            })?;
            apis = apis.with(webhook_inbox_schemes::Provider::STRIPE, std::sync::Arc::new(stripe));
        }
        #[cfg(not(feature = "http-client"))]
        let _ = env;
        Ok(apis.merged(app.apis()))
    }
}
