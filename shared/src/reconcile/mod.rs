//! Reconciliation: webhook delivery is not guaranteed, so fetch from the
//! providers' APIs what never arrived, through the very same claim as webhooks
//! (marked `source = 'reconcile'`): Stripe's events under their own ids,
//! Shopify's orders as `orders/updated` events keyed by the order and its
//! `updated_at`, for the application's handlers to apply (the stock
//! application's version guard makes a snapshot it has already seen change
//! nothing). Checkpoints advance only after what was found has committed, so a
//! run that dies is simply run again: nothing lands twice.
//!
//! A run walks from its checkpoint to the present in windows
//! (`RECONCILE_WINDOW_MINUTES`) and saves the checkpoint after each: a first
//! run's 72 hours, or a backlog after an outage, take several bounded runs,
//! each starting where the last stopped, instead of timing out forever.
//!
//! GitHub keeps no time filter on its hook deliveries: [`GithubDeliveries`]
//! lists each hook's deliveries newest first down to its checkpoint and
//! fetches the payload of each one the inbox does not hold.
//!
//! Every source has one shape, [`Source`]: a name, and a run that claims what
//! the inbox is missing through [`claim`] (the webhook claim, as
//! `source = 'reconcile'`). A team adds its own with [`crate::App::with_source`],
//! the way it adds a handler.

mod github;
mod shopify;
mod stripe;

pub use github::{GithubDeliveries, Hook};
pub use shopify::ShopifyOrders;
pub use stripe::StripeEvents;

use std::{
    future::Future,
    pin::Pin,
    time::{Duration, Instant},
};

use sqlx::{PgConnection, PgPool};

use crate::{
    core::http::retry_after,
    db::checkpoints,
    receive::claim::{self, Claim, Envelope},
    runtime::stage::{Pass, Reported, Stage, Tally},
};
use webhook_inbox_schemes::{text::Escaped, InitialStatus, NewEvent, Provider};

/// Why a source's run stopped (its checkpoint stays where the last complete window left it).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The provider's API answered with an error status.
    #[error("{api} answered HTTP {status}: {body}")]
    Api {
        /// The API (`"Stripe"`).
        api: &'static str,
        /// The HTTP status.
        status: u16,
        /// The answer's body, cut to 500 characters.
        body: String,
    },
    /// The request did not get an answer.
    #[error("{api} request failed: {source}")]
    Request {
        /// The API.
        api: &'static str,
        /// Why.
        source: reqwest::Error,
    },
    /// The answer was not what the API documents.
    #[error("{api} sent an unexpected body: {reason}")]
    Body {
        /// The API.
        api: &'static str,
        /// What was wrong with it.
        reason: String,
    },
    /// The inbox's database.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// What a run found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Found {
    /// Events (orders, deliveries) the API listed.
    pub fetched: usize,
    /// Events the inbox did not have (Shopify: order snapshots), claimed.
    pub applied: usize,
    /// Events the inbox already held.
    pub already_known: usize,
    /// Kept as `failed` rows with their reason (unusable, or refused by PostgreSQL).
    pub failed: usize,
    /// False when the deadline came before the present: the next run resumes
    /// from the last window saved.
    pub finished: bool,
}

impl Found {
    /// Adds another run's (or window's) counts; `finished` stays as it is.
    pub fn add(&mut self, o: &Found) {
        self.fetched += o.fetched;
        self.applied += o.applied;
        self.already_known += o.already_known;
        self.failed += o.failed;
    }
}

/// How far back reconcile looks, and in which steps.
#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    /// `RECONCILE_LOOKBACK_HOURS` (72): how far back the first run looks.
    pub first_lookback: Duration,
    /// Re-read this much before the checkpoint, for clocks and late writes (5 min).
    pub overlap: Duration,
    /// `RECONCILE_WINDOW_MINUTES` (60): the checkpoint is saved after each window.
    pub window: Duration,
}

/// Walks `source` (its checkpoint's name) from its checkpoint to now, window
/// by window (`[start, end)` in Unix seconds), and moves the checkpoint to
/// each window's end once everything `window` found in it has committed; a
/// window that comes back incomplete (the deadline came first) ends the run,
/// unfinished. For an API that filters by time, as Stripe's and Shopify's do.
pub async fn walk<F, Fut>(
    pool: &PgPool,
    source: &str,
    config: &ReconcileConfig,
    mut window: F,
) -> Result<Found, ReconcileError>
where
    F: FnMut(i64, i64) -> Fut,
    Fut: std::future::Future<Output = Result<(Found, bool), ReconcileError>>,
{
    let mut found = Found::default();
    for (start, end) in windows(pool, source, config).await? {
        let (more, complete) = window(start, end).await?;
        found.add(&more);
        if !complete {
            return Ok(found);
        }
        checkpoints::save(pool, source, end as f64).await?;
    }
    found.finished = true;
    Ok(found)
}

/// From the checkpoint (less the overlap), or the first lookback, to now, in
/// whole seconds: `[start, end)` windows of at most `config.window`.
async fn windows(pool: &PgPool, source: &str, config: &ReconcileConfig) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    let now = now_epoch();
    let checkpoint = checkpoints::load(pool, source).await?.unwrap_or(now - config.first_lookback.as_secs_f64());
    let (mut start, end) = ((checkpoint - config.overlap.as_secs_f64()).max(0.0) as i64, now.ceil() as i64);
    let step = config.window.as_secs().max(1) as i64;
    let mut windows = Vec::new();
    while start < end {
        windows.push((start, (start + step).min(end)));
        start += step;
    }
    Ok(windows)
}

/// Claims `event`, fetched from `provider`'s API, through the webhook claim
/// (`source = 'reconcile'`; `body` its bytes as stored, `headers` what receive
/// would have kept), counting it in `found`: new, already known, or kept as
/// `failed` (an event made [`NewEvent::unusable`]). Each event in its own
/// statement, as a webhook's: a payload PostgreSQL refuses is kept `failed`
/// without it, and the next one goes on.
pub async fn claim(
    conn: &mut PgConnection,
    provider: Provider,
    body: &[u8],
    headers: &serde_json::Value,
    event: &NewEvent,
    found: &mut Found,
) -> Result<(), sqlx::Error> {
    let env = Envelope {
        provider,
        raw_body: body,
        headers,
        secret_index: None,
        secret_fingerprint: None,
        replay_guard: false,
        trace_context: None,
    };
    let claimed = claim::claim_one(conn, &env, event).await?;
    found.fetched += 1;
    match (event.status, claimed) {
        (InitialStatus::Pending, Claim::New) => found.applied += 1,
        (InitialStatus::Pending, Claim::Duplicate | Claim::Replay) => found.already_known += 1,
        (InitialStatus::Failed, _) => {
            tracing::warn!(%provider, reason = ?event.failure_reason.as_deref().map(webhook_inbox_schemes::text::escape), "fetched event kept as failed");
            found.failed += 1;
        }
    }
    Ok(())
}

/// What [`Source::reconcile`] returns: its run, boxed.
pub type SourceRun<'a> = Pin<Box<dyn Future<Output = Result<Found, ReconcileError>> + Send + 'a>>;

/// A provider API that reconcile reads: the built-in ones (Stripe's events,
/// Shopify's orders, GitHub's hook deliveries) and a team's own, added with
/// [`crate::App::with_source`]. A run claims, with [`claim`], what the inbox
/// is missing since the source's checkpoint ([`walk`] keeps one for an API
/// that filters by time), asks for nothing past `deadline`, and says with
/// [`Found::finished`] whether it got to the present.
///
/// ```no_run
/// use std::time::Instant;
///
/// use webhook_inbox::reconciliation::{
///     answer_text, claim, walk, Found, ReconcileConfig, ReconcileError, Source, SourceRun,
/// };
/// use webhook_inbox::{schemes::NewEvent, sqlx::PgPool, App, Handlers, Provider};
///
/// /// Acme's `GET /events?from=&to=`, one JSON event per line.
/// struct AcmeEvents {
///     client: reqwest::Client,
/// }
///
/// impl AcmeEvents {
///     async fn window(&self, pool: &PgPool, from: i64, to: i64) -> Result<(Found, bool), ReconcileError> {
///         let api = "Acme";
///         let url = format!("https://api.acme.example/events?from={from}&to={to}");
///         let text = self.client.get(url).send().await.and_then(|r| r.error_for_status());
///         let text = text.map_err(|source| ReconcileError::Request { api, source })?;
///         let text = answer_text(api, text).await?; // at most 16 MiB
///         let (mut found, mut conn) = (Found::default(), pool.acquire().await?);
///         for line in text.lines() {
///             let json: Option<serde_json::Value> = serde_json::from_str(line).ok();
///             let id = json.as_ref().and_then(|j| j["id"].as_str()).map(str::to_string);
///             let event = NewEvent::from_json(line.as_bytes(), id, "acme.event");
///             let acme = Provider::try_from("acme").expect("a valid name");
///             claim(&mut conn, acme, line.as_bytes(), &serde_json::json!({}), &event, &mut found).await?;
///         }
///         Ok((found, true))
///     }
/// }
///
/// impl Source for AcmeEvents {
///     fn name(&self) -> String {
///         "acme events".into()
///     }
///
///     fn reconcile<'a>(
///         &'a self,
///         pool: &'a PgPool,
///         config: &'a ReconcileConfig,
///         _deadline: Instant,
///     ) -> SourceRun<'a> {
///         Box::pin(walk(pool, "acme:events", config, move |from, to| self.window(pool, from, to)))
///     }
/// }
///
/// // The `reconcile` function, `inbox serve` and `inbox reconcile` built from this app run it.
/// let app = App::new(Handlers::new()).with_source(AcmeEvents { client: reqwest::Client::new() });
/// # drop(app);
/// ```
pub trait Source: Send + Sync {
    /// The source in logs, reports and metrics: its first word is the
    /// provider (`"stripe events"`, `"github repos/o/r/hooks/1"`).
    fn name(&self) -> String;

    /// One run; an error stops this source alone, its checkpoint unmoved.
    fn reconcile<'a>(&'a self, pool: &'a PgPool, config: &'a ReconcileConfig, deadline: Instant) -> SourceRun<'a>;
}

/// An API's answer as text, at most 16 MiB: a longer one is refused with a
/// clear error ([`ReconcileError::Body`]), not read into memory. For a
/// team's own [`Source`], as for the built-in ones.
pub async fn answer_text(api: &'static str, response: reqwest::Response) -> Result<String, ReconcileError> {
    use crate::core::http::{text, AnswerError, MAX_ANSWER_BYTES};
    text(response, MAX_ANSWER_BYTES).await.map_err(|e| match e {
        AnswerError::Failed(source) => ReconcileError::Request { api, source },
        too_large => ReconcileError::Body { api, reason: too_large.to_string() },
    })
}

/// GET with `429`/`Retry-After` honoured (up to 5 tries, at most 30 s a wait).
async fn get(api: &'static str, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ReconcileError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(r) = req.try_clone() else {
            return Err(ReconcileError::Body { api, reason: "request cannot be retried".into() });
        };
        let response = r.send().await.map_err(|source| ReconcileError::Request { api, source })?;
        if response.status().as_u16() == 429 && attempt < 5 {
            // Shopify sends `Retry-After: 2.0`; Stripe whole seconds.
            let wait = retry_after(response.headers()).unwrap_or(Duration::from_secs(1)).min(Duration::from_secs(30));
            tracing::info!(api, ?wait, "rate limited; waiting as asked");
            tokio::time::sleep(wait).await;
            continue;
        }
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let body = crate::core::http::text(response, 64 * 1024).await.unwrap_or_default();
            return Err(ReconcileError::Api { api, status, body: body.chars().take(500).collect() });
        }
        return Ok(response);
    }
}

fn now_epoch() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// What to say when there is nothing to reconcile.
pub const NOTHING_TO_RECONCILE: &str = "nothing to reconcile: set STRIPE_API_KEY, SHOPIFY_SHOP_DOMAIN and SHOPIFY_ACCESS_TOKEN, or GITHUB_API_TOKEN and GITHUB_HOOKS (or add a source to the app)";

/// What a run did: each source's counts, and why any source failed (by [`Source::name`]).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Reconciled {
    /// The sources that ran to the present, or to the deadline.
    pub sources: std::collections::BTreeMap<String, Found>,
    /// The sources whose run failed, and why.
    pub failed: std::collections::BTreeMap<String, String>,
}

impl Tally for Reconciled {
    fn add(&mut self, other: &Reconciled) {
        for (source, found) in &other.sources {
            let mine = self.sources.entry(source.clone()).or_default();
            mine.fetched += found.fetched;
            mine.applied += found.applied;
            mine.already_known += found.already_known;
            mine.failed += found.failed;
            mine.finished = found.finished;
        }
        self.failed.extend(other.failed.iter().map(|(s, e)| (s.clone(), e.clone())));
    }

    fn is_empty(&self) -> bool {
        self.failed.is_empty() && self.sources.values().all(|f| f.fetched == 0 && f.failed == 0)
    }
}

impl Reported for Reconciled {
    /// The `reconcile` function's metrics, one line per source (provider):
    /// `reconciled` (new), `reconcile_fetched`, `reconcile_stored_failed`,
    /// `reconcile_errors` (the source's run failed).
    fn metrics(&self) -> Vec<crate::runtime::metrics::Metrics> {
        let provider = |source: &str| source.split(' ').next().unwrap_or("unknown").to_string();
        let mut lines = Vec::new();
        for (source, found) in &self.sources {
            let mut m = crate::runtime::metrics::Metrics::new("reconcile").for_provider(provider(source));
            m.count("reconciled", found.applied as u64)
                .count("reconcile_fetched", found.fetched as u64)
                .count("reconcile_stored_failed", found.failed as u64)
                .count("reconcile_errors", 0);
            lines.push(m);
        }
        for source in self.failed.keys() {
            let mut m = crate::runtime::metrics::Metrics::new("reconcile").for_provider(provider(source));
            m.count("reconcile_errors", 1);
            lines.push(m);
        }
        lines
    }

    /// The sources whose run failed, and why.
    fn failures(&self) -> Option<String> {
        let failed: Vec<String> = self.failed.iter().map(|(source, e)| format!("{source}: {e}")).collect();
        (!failed.is_empty()).then(|| failed.join("; "))
    }
}

/// The reconcile stage: every configured source, on `pool`. Run it as a
/// [`Stage`] (one pass: each source walks from its checkpoint to the present
/// or the deadline), or with [`Reconciler::run_once`].
pub struct Reconciler {
    pool: PgPool,
    sources: Vec<std::sync::Arc<dyn Source>>,
    config: ReconcileConfig,
}

impl Stage for Reconciler {
    type Tally = Reconciled;
    const NAME: &'static str = "reconcile";
    /// Each source walks its backlog for up to ten minutes a pass (every 15 minutes in `serve`).
    const PASS: Duration = Duration::from_secs(600);

    /// One pass of every source; the next is the next run's (the schedule's).
    async fn run_once(&self, deadline: Instant) -> Result<Pass<Reconciled>, sqlx::Error> {
        Ok(Pass { tally: Reconciler::run_once(self, deadline).await, more: false })
    }
}

impl Reconciler {
    /// No source yet, on `pool`.
    pub fn new(pool: PgPool, config: ReconcileConfig) -> Self {
        Reconciler { pool, sources: Vec::new(), config }
    }

    /// One more source.
    pub fn with_source(mut self, source: std::sync::Arc<dyn Source>) -> Self {
        self.sources.push(source);
        self
    }

    /// At least one source.
    pub fn is_configured(&self) -> bool {
        !self.sources.is_empty()
    }

    /// The sources' names, in the order they run (for the settings' tests).
    #[cfg(all(test, feature = "full"))]
    pub(crate) fn names(&self) -> Vec<String> {
        self.sources.iter().map(|s| s.name()).collect()
    }

    /// Runs each source once, each on its own: one failing does not stop the
    /// others; none asks for a page past `deadline`. The Lambda and
    /// `inbox reconcile` both report it.
    pub async fn run_once(&self, deadline: Instant) -> Reconciled {
        let mut out = Reconciled::default();
        for source in &self.sources {
            let name = source.name();
            match source.reconcile(&self.pool, &self.config, deadline).await {
                Ok(found) if !found.finished => {
                    tracing::warn!(source = %Escaped(&name), ?found, "reconciled up to the deadline; the next run resumes");
                    out.sources.insert(name, found);
                }
                Ok(found) => {
                    tracing::info!(source = %Escaped(&name), ?found, "reconciled");
                    out.sources.insert(name, found);
                }
                Err(e) => {
                    tracing::error!(source = %Escaped(&name), error = %Escaped(&e.to_string()), "reconcile failed");
                    out.failed.insert(name, e.to_string());
                }
            }
        }
        out
    }
}

/// The `rel="next"` URL of a `Link` header.
fn next_link(link: &str) -> Option<String> {
    link.split(',').find(|part| part.contains("rel=\"next\"")).and_then(|part| {
        let start = part.find('<')? + 1;
        let len = part[start..].find('>')?;
        Some(part[start..start + len].to_string())
    })
}

/// Whether `link` is on the same origin (scheme, host, port) as `base`.
fn same_origin(base: &str, link: &str) -> bool {
    match (reqwest::Url::parse(base), reqwest::Url::parse(link)) {
        (Ok(b), Ok(l)) => {
            b.scheme() == l.scheme()
                && b.host_str() == l.host_str()
                && b.port_or_known_default() == l.port_or_known_default()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn next_links_are_read_from_the_link_header() {
        let h = r#"<https://s.myshopify.com/admin/api/2024-10/orders.json?page_info=abc&limit=250>; rel="next", <https://x>; rel="previous""#;
        assert_eq!(
            super::next_link(h).as_deref(),
            Some("https://s.myshopify.com/admin/api/2024-10/orders.json?page_info=abc&limit=250")
        );
        assert_eq!(super::next_link(r#"<https://x>; rel="previous""#), None);
        assert_eq!(
            super::next_link(r#">https://x<; rel="next""#),
            None,
            "brackets the wrong way round: no link, no panic"
        );
    }

    #[test]
    fn only_links_on_the_shops_own_origin_are_followed() {
        let base = "https://s.myshopify.com";
        assert!(super::same_origin(base, "https://s.myshopify.com/admin/api/2024-10/orders.json?page_info=x"));
        assert!(super::same_origin(base, "https://s.myshopify.com:443/admin"));
        for other in [
            "https://evil.example/admin",
            "http://s.myshopify.com/admin",
            "https://s.myshopify.com:8443/admin",
            "https://s.myshopify.com.evil.example/admin",
            "https://s.myshopify.com@evil.example/admin",
            "/admin/api/orders.json",
        ] {
            assert!(!super::same_origin(base, other), "{other}");
        }
    }
}
