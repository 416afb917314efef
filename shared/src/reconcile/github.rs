//! GitHub's hook deliveries. GitHub does not redeliver on its own: a delivery
//! it could not make is gone unless someone asks for it, and it keeps each
//! hook's deliveries, with the request's headers and payload, for three days.
//! So reconcile lists them (`GET /<hook>/deliveries`, newest first, cursor
//! pages through `Link`) down to the hook's checkpoint, and claims each one
//! whose `guid` the inbox does not hold, through the webhook claim: the event
//! id receive uses (`X-GitHub-Delivery`), the type it makes (`X-GitHub-Event`
//! and the payload's `action`), the payload of `GET /<hook>/deliveries/<id>`.

use std::{collections::HashSet, time::Instant};

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::value::RawValue;
use sqlx::PgPool;

use super::{claim, get, next_link, now_epoch, same_origin, Found, ReconcileConfig, ReconcileError, Source, SourceRun};
use crate::{core::http::http_client, db::checkpoints};
use webhook_inbox_schemes::ConfigError;
use webhook_inbox_schemes::{
    declared::{parse_time, TimeFormat},
    github::{Github, DELIVERY, EVENT},
    secret::Secret,
    Delivery, Events, NewEvent, Provider, Scheme,
};

const API: &str = "GitHub";

/// A hook whose deliveries reconcile reads, as `GITHUB_HOOKS` names it:
/// `repos/<owner>/<repo>/hooks/<id>`, `orgs/<org>/hooks/<id>`, or `app` (the
/// GitHub App's hook, `app/hook`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook(String);

impl Hook {
    /// The hook's API path, checked: names GitHub allows, a numeric id.
    pub fn parse(text: &str) -> Result<Hook, String> {
        let name = |p: &str| {
            !p.is_empty()
                && p.len() <= 100
                && p != "."
                && p != ".."
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        let id = |p: &str| !p.is_empty() && p.len() <= 20 && p.bytes().all(|b| b.is_ascii_digit());
        let parts: Vec<&str> = text.trim().split('/').collect();
        match parts.as_slice() {
            ["app"] | ["app", "hook"] => Ok(Hook("app/hook".into())),
            ["repos", owner, repo, "hooks", n] if name(owner) && name(repo) && id(n) => {
                Ok(Hook(format!("repos/{owner}/{repo}/hooks/{n}")))
            }
            ["orgs", org, "hooks", n] if name(org) && id(n) => Ok(Hook(format!("orgs/{org}/hooks/{n}"))),
            _ => Err(format!(
                "{:?} is not a hook: repos/<owner>/<repo>/hooks/<id>, orgs/<org>/hooks/<id> or app",
                webhook_inbox_schemes::text::escape(text)
            )),
        }
    }

    /// Its API path (`repos/o/r/hooks/1`, `orgs/o/hooks/2`, `app/hook`).
    pub fn path(&self) -> &str {
        &self.0
    }
}

/// One hook's deliveries: `GITHUB_API_BASE` (default `https://api.github.com`),
/// `GITHUB_API_TOKEN`, one source per hook of `GITHUB_HOOKS`, each with its
/// own checkpoint (`github:<hook path>`).
pub struct GithubDeliveries {
    client: reqwest::Client,
    base: String,
    token: Secret,
    hook: Hook,
}

/// A delivery as the list shows it (no payload).
#[derive(Deserialize)]
struct Listed {
    id: Option<u64>,
    guid: Option<String>,
    delivered_at: Option<String>,
    event: Option<String>,
}

/// A delivery with its request.
#[derive(Deserialize)]
struct Detail<'a> {
    #[serde(borrow)]
    request: Option<Request<'a>>,
}

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(default)]
    headers: serde_json::Map<String, serde_json::Value>,
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
}

impl GithubDeliveries {
    /// `hook`'s deliveries at `base` (`https://api.github.com`, or GitHub Enterprise's `/api/v3`).
    pub fn new(base: impl Into<String>, token: Secret, hook: Hook) -> Result<Self, ConfigError> {
        let client = http_client(std::time::Duration::from_secs(30)).map_err(|e| ConfigError::Invalid {
            var: "GITHUB_API_TOKEN".into(),
            reason: format!("cannot build an HTTP client: {e}"),
        })?;
        Ok(GithubDeliveries { client, base: base.into().trim_end_matches('/').to_string(), token, hook })
    }

    fn request(&self, url: &str) -> Result<reqwest::RequestBuilder, ReconcileError> {
        let mut auth = HeaderValue::from_bytes(&[b"Bearer ", self.token.expose()].concat()).map_err(|_| {
            ReconcileError::Body { api: API, reason: "GITHUB_API_TOKEN is not a valid header value".into() }
        })?;
        auth.set_sensitive(true);
        Ok(self
            .client
            .get(url)
            .header(reqwest::header::AUTHORIZATION, auth)
            .header(reqwest::header::ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28"))
    }

    /// The whole walk: pages newest first down to the checkpoint (less the
    /// overlap; the first run, the lookback), then the checkpoint moves to
    /// when the walk began. One cut short by the deadline, or failed, leaves
    /// it where it was: the next run walks the same deliveries again, and the
    /// ones claimed meanwhile are in the inbox.
    async fn walk(&self, pool: &PgPool, config: &ReconcileConfig, deadline: Instant) -> Result<Found, ReconcileError> {
        let checkpoint_name = format!("github:{}", self.hook.path());
        let began = now_epoch();
        let since = checkpoints::load(pool, &checkpoint_name)
            .await?
            .map_or(began - config.first_lookback.as_secs_f64(), |c| c - config.overlap.as_secs_f64());
        let mut found = Found::default();
        let mut seen = HashSet::new();
        let mut url = format!("{}/{}/deliveries?per_page=100", self.base, self.hook.path());
        loop {
            if Instant::now() >= deadline {
                return Ok(found);
            }
            let response = get(API, self.request(&url)?).await?;
            let next = response.headers().get(reqwest::header::LINK).and_then(|v| v.to_str().ok()).and_then(next_link);
            let text = super::answer_text(API, response).await?;
            let page: Vec<Box<RawValue>> = serde_json::from_str(&text)
                .map_err(|e| ReconcileError::Body { api: API, reason: format!("not a list of deliveries: {e}") })?;
            let mut older = false;
            let mut wanted = Vec::new();
            for raw in &page {
                let listed: Listed = serde_json::from_str(raw.get()).unwrap_or(Listed {
                    id: None,
                    guid: None,
                    delivered_at: None,
                    event: None,
                });
                match listed.delivered_at.as_deref().and_then(|t| parse_time(t, TimeFormat::Rfc3339)) {
                    Some(at) if (at as f64) < since => older = true,
                    // A delivery without a readable time is taken: better twice-checked than missed.
                    _ => {
                        // A redelivery shares its guid: one claim per guid.
                        if listed.guid.as_ref().map_or(true, |g| seen.insert(g.clone())) {
                            wanted.push(listed);
                        }
                    }
                }
            }
            if !self.claim_missing(pool, &wanted, deadline, &mut found).await? {
                return Ok(found);
            }
            match next {
                Some(link) if !older && !page.is_empty() => {
                    if !same_origin(&self.base, &link) {
                        return Err(ReconcileError::Body {
                            api: API,
                            reason: "the next page's link leads to another host; not followed, the token stays home"
                                .into(),
                        });
                    }
                    url = link;
                }
                _ => break,
            }
        }
        checkpoints::save(pool, &checkpoint_name, began).await?;
        found.finished = true;
        Ok(found)
    }

    /// Claims those of `listed` whose guid the inbox does not hold, each with
    /// its payload fetched; false if the deadline came first.
    async fn claim_missing(
        &self,
        pool: &PgPool,
        listed: &[Listed],
        deadline: Instant,
        found: &mut Found,
    ) -> Result<bool, ReconcileError> {
        let guids: Vec<&str> = listed.iter().filter_map(|l| l.guid.as_deref()).collect();
        let known: HashSet<String> = crate::db::query_scalar(
            "SELECT event_id FROM webhook_inbox WHERE provider = 'github' AND event_id = ANY($1)",
        )
        .bind(&guids)
        .fetch_all(crate::db::Autocommit(pool))
        .await?
        .into_iter()
        .collect();
        let mut conn = pool.acquire().await?;
        for delivery in listed {
            if delivery.guid.as_ref().is_some_and(|g| known.contains(g)) {
                found.fetched += 1;
                found.already_known += 1;
                continue;
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            let (body, kept, event) = self.fetch(delivery).await?;
            claim(&mut conn, Provider::GITHUB, body.as_bytes(), &kept, &event, found).await?;
        }
        Ok(true)
    }

    /// The delivery as receive would have made it, or, when it cannot be
    /// used, a `failed` event of its own (`reconcile:github:<guid or id>`, so
    /// that it never stands in the way of the delivery itself).
    async fn fetch(&self, delivery: &Listed) -> Result<(String, serde_json::Value, NewEvent), ReconcileError> {
        let listed_event = delivery.event.clone().unwrap_or_else(|| "unknown".into());
        let unusable = |reason: String| {
            let key = delivery.guid.clone().or(delivery.id.map(|id| id.to_string())).unwrap_or_default();
            let id = format!("reconcile:github:{key}");
            let id = if key.is_empty() || id.chars().count() > webhook_inbox_schemes::MAX_EVENT_ID_CHARS {
                "reconcile:github:unidentified".to_string()
            } else {
                id
            };
            (String::new(), serde_json::json!({}), NewEvent::unusable(id, &listed_event, None, reason))
        };
        let (Some(id), Some(guid)) = (delivery.id, delivery.guid.as_deref()) else {
            return Ok(unusable("the listed delivery has no id or no guid".into()));
        };
        let url = format!("{}/{}/deliveries/{id}", self.base, self.hook.path());
        let text = match get(API, self.request(&url)?).await {
            Ok(response) => super::answer_text(API, response).await?,
            // Gone since it was listed (older than GitHub keeps): this one alone.
            Err(ReconcileError::Api { status: 404, .. }) => {
                return Ok(unusable(format!("delivery {id} is no longer kept by GitHub (HTTP 404)")))
            }
            Err(e) => return Err(e),
        };
        let detail: Detail<'_> = match serde_json::from_str(&text) {
            Ok(detail) => detail,
            Err(e) => return Ok(unusable(format!("delivery {id}: unexpected body: {e}"))),
        };
        let Some(Request { headers: sent, payload: Some(payload) }) = detail.request else {
            return Ok(unusable(format!("delivery {id} has no request payload")));
        };
        // Receive's input, rebuilt: the two headers the scheme reads, and the payload's JSON.
        let mut headers = HeaderMap::new();
        for (name, value) in [(DELIVERY, guid), (EVENT, listed_event.as_str()), ("content-type", "application/json")] {
            match HeaderValue::from_str(value) {
                Ok(v) => headers.insert(HeaderName::from_static(name), v),
                Err(_) => return Ok(unusable(format!("delivery {id}: its {name} is not a header value"))),
            };
        }
        let scheme = Github::new(vec![]);
        let body = payload.get().to_string();
        let Events::Single(event) = scheme.events(&Delivery { headers: &headers, body: body.as_bytes(), now: 0 })
        else {
            return Ok(unusable(format!("delivery {id} does not make one event")));
        };
        // The headers receive keeps, as GitHub recorded them.
        let keep = scheme.kept_headers();
        let kept: serde_json::Map<String, serde_json::Value> = sent
            .into_iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value))
            .filter(|(name, value)| keep.contains(&name.as_str()) && value.is_string())
            .collect();
        Ok((body, serde_json::Value::Object(kept), event))
    }
}

impl Source for GithubDeliveries {
    fn name(&self) -> String {
        format!("github {}", self.hook.path())
    }

    fn reconcile<'a>(&'a self, pool: &'a PgPool, config: &'a ReconcileConfig, deadline: Instant) -> SourceRun<'a> {
        Box::pin(self.walk(pool, config, deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_are_the_three_paths_github_has() {
        assert_eq!(Hook::parse("repos/octo/hello-world/hooks/12").unwrap().path(), "repos/octo/hello-world/hooks/12");
        assert_eq!(Hook::parse(" orgs/octo/hooks/7 ").unwrap().path(), "orgs/octo/hooks/7");
        assert_eq!(Hook::parse("app").unwrap().path(), "app/hook");
        for bad in [
            "",
            "repos/octo/hooks/1",
            "repos/../x/hooks/1",
            "repos/o/r/hooks/x",
            "orgs/o/hooks/1/../../x",
            "users/o/hooks/1",
            "repos/o/r?x=1/hooks/1",
            "/repos/o/r/hooks/1",
        ] {
            assert!(Hook::parse(bad).is_err(), "{bad}");
        }
    }
}
