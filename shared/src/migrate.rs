//! Lambda `migrate`: a CloudFormation custom resource that applies the
//! embedded migrations, the inbox's and then the application's
//! ([`crate::App::migrate`]), when the stack is created or updated, before the
//! other functions exist (they depend on it).
//!
//! Create and Update apply whatever is pending (each history records what was
//! applied, so a second run is a no-op) and answer with the inbox's latest version; Delete
//! answers at once and touches nothing: deleting the stack never drops data.
//! Every request is answered, success or failure, before the function's own
//! deadline: CloudFormation would otherwise wait an hour for a response.

use std::time::{Duration, Instant};

use aws_lambda_events::event::cloudformation::{
    CloudFormationCustomResourceRequest as Request, CloudFormationCustomResourceResponse as Response,
    CloudFormationCustomResourceResponseStatus as Status,
};
use sqlx::PgPool;
use url::Url;

use crate::{app::App, config::Env};

/// The one physical id: updates never replace the resource (a replacement
/// would send a Delete for the old one).
pub(crate) const PHYSICAL_ID: &str = "webhook-inbox-migrations";

/// Where an answer may go: CloudFormation's pre-signed S3 URLs (https, an S3
/// host of the function's region, or S3's global host), or the S3 endpoint
/// `AWS_ENDPOINT_URL_S3` names (an emulator's). A request whose `ResponseURL`
/// is anything else did not come from CloudFormation: it is not acted on, and
/// nothing is sent to that URL.
#[derive(Clone, Debug)]
pub(crate) struct ResponseUrls {
    region: String,
    endpoint: Option<Url>,
}

/// Why a request was not answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotAnswered {
    /// Its `ResponseURL` is not CloudFormation's: nothing was done or sent.
    #[error("ResponseURL {0}: not acted on, and not answered")]
    Refused(String),
    /// The answer could not be delivered, three times.
    #[error("the answer could not be delivered: {0}")]
    Undelivered(#[from] reqwest::Error),
}

impl ResponseUrls {
    /// `AWS_REGION` (which Lambda sets) and `AWS_ENDPOINT_URL_S3`.
    pub(crate) fn read(env: &Env) -> Self {
        let endpoint = env.var("AWS_ENDPOINT_URL_S3").and_then(|u| Url::parse(&u).ok());
        ResponseUrls::new(&env.var("AWS_REGION").unwrap_or_default(), endpoint)
    }

    /// The S3 hosts of `region`, and `endpoint`'s origin when given.
    pub(crate) fn new(region: &str, endpoint: Option<Url>) -> Self {
        ResponseUrls { region: region.to_ascii_lowercase(), endpoint }
    }

    /// Whether an answer may be sent to `url`; the reason names the host, never the URL (a credential).
    pub(crate) fn check(&self, url: &str) -> Result<(), String> {
        let url = Url::parse(url).map_err(|_| "is not a URL".to_string())?;
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        if let Some(e) = &self.endpoint {
            if url.origin() == e.origin() {
                return Ok(());
            }
        }
        if url.scheme() != "https" || !url.username().is_empty() || url.password().is_some() {
            return Err(format!("is not an https URL without credentials (host {host:?})"));
        }
        if url.port().is_some_and(|p| p != 443) {
            return Err(format!("names a port (host {host:?})"));
        }
        let suffix = if self.region.starts_with("cn-") { "amazonaws.com.cn" } else { "amazonaws.com" };
        let r = &self.region;
        let s3 = [format!("s3.{r}.{suffix}"), format!("s3-{r}.{suffix}"), format!("s3.dualstack.{r}.{suffix}")];
        let global = "s3.amazonaws.com".to_string();
        let hosts = s3.iter().filter(|_| !r.is_empty()).chain(std::iter::once(&global));
        let hosts: Vec<&String> = hosts.collect();
        if hosts.iter().any(|h| host == **h || host.strip_suffix(h.as_str()).is_some_and(|b| b.ends_with('.'))) {
            Ok(())
        } else {
            Err(format!(
                "host {host:?} is not S3's in {}",
                if r.is_empty() { "any region (AWS_REGION is unset)" } else { r }
            ))
        }
    }
}

/// Whatever the request, CloudFormation gets an answer (the status returned);
/// the error is returned only when even the answer could not be delivered, or
/// the request's `ResponseURL` is not CloudFormation's (see [`ResponseUrls`]).
/// `db` is the pool, or why the function could not make one (its
/// configuration): then Create and Update fail with that reason, and Delete
/// still succeeds, so that a stack with a broken secret can be deleted.
pub(crate) async fn on_custom_resource(
    app: &App,
    request: Request,
    db: Result<&PgPool, &str>,
    http: &reqwest::Client,
    urls: &ResponseUrls,
    deadline: Instant,
) -> Result<Status, NotAnswered> {
    let (kind, response_url, stack_id, request_id, logical_id) = match request {
        Request::Create(r) => ("Create", r.response_url, r.stack_id, r.request_id, r.logical_resource_id),
        Request::Update(r) => ("Update", r.response_url, r.stack_id, r.request_id, r.logical_resource_id),
        Request::Delete(r) => ("Delete", r.response_url, r.stack_id, r.request_id, r.logical_resource_id),
        // Unreachable: a request of another type does not deserialize into `Request`.
        _ => return Ok(Status::Failed),
    };
    if let Err(reason) = urls.check(&response_url) {
        tracing::error!(kind, %reason, "a request whose ResponseURL is not CloudFormation's: not acted on");
        return Err(NotAnswered::Refused(reason));
    }
    let outcome = match (kind, db) {
        ("Delete", _) => Ok(None),
        (_, Err(reason)) => Err(reason.to_string()),
        (_, Ok(pool)) => apply(app, pool, deadline).await.map(Some),
    };
    let mut response = Response::default();
    response.physical_resource_id = PHYSICAL_ID.into();
    (response.stack_id, response.request_id, response.logical_resource_id) = (stack_id, request_id, logical_id);
    match outcome {
        Ok(version) => {
            if let Some(version) = version {
                response.data.insert("Version".into(), version.to_string());
            }
            tracing::info!(kind, ?version, "migrations applied");
        }
        Err(reason) => {
            tracing::error!(kind, %reason, "migrations failed");
            response.status = Status::Failed;
            // CloudFormation shows the reason in the stack's events; it keeps 4 KB of a response.
            response.reason = Some(reason.chars().take(1000).collect());
        }
    }
    answer(http, &response_url, &response).await?;
    Ok(response.status)
}

/// The latest applied version, after applying what is pending.
async fn apply(app: &App, pool: &PgPool, deadline: Instant) -> Result<i64, String> {
    let run = tokio::time::timeout_at(deadline.into(), app.migrate(pool));
    match run.await {
        Err(_) => {
            Err("the migrations did not finish before the function's deadline; they resume on the next deploy".into())
        }
        Ok(Err(e)) => Err(format!("cannot apply the migrations: {e}")),
        Ok(Ok(version)) => Ok(version),
    }
}

/// PUT to the pre-signed S3 URL, with no content type (it is part of the
/// signature), tried three times.
async fn answer(http: &reqwest::Client, url: &str, response: &Response) -> Result<(), reqwest::Error> {
    let body = serde_json::to_vec(response).expect("a response serializes");
    let mut tries = 0;
    loop {
        tries += 1;
        // The URL is a credential (a pre-signed write): kept out of errors and logs.
        let sent = http.put(url).body(body.clone()).send().await.and_then(|r| r.error_for_status());
        let sent = sent.map_err(reqwest::Error::without_url);
        match sent {
            Ok(_) => return Ok(()),
            Err(e) if tries >= 3 => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, tries, "could not answer CloudFormation; retrying");
                tokio::time::sleep(Duration::from_millis(500 * tries)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ResponseUrls;

    /// Only CloudFormation's pre-signed S3 URLs are answered: a request naming
    /// any other (an invocation by someone else, pointing the answer at an
    /// internal host) is not acted on (the function's binary on such a request:
    /// `functions/migrate/tests/custom_resource.rs`).
    #[test]
    fn only_s3_urls_of_the_region_or_the_configured_endpoint_are_cloudformations() {
        let urls = ResponseUrls::new("eu-west-1", None);
        for ok in [
            "https://cloudformation-custom-resource-response-euwest1.s3.eu-west-1.amazonaws.com/arn%3A/x?X-Amz-Signature=s",
            "https://cloudformation-custom-resource-response-euwest1.s3-eu-west-1.amazonaws.com/x",
            "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/x",
            "https://S3.EU-WEST-1.AMAZONAWS.COM/bucket/x",
        ] {
            assert_eq!(urls.check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://cloudformation-custom-resource-response-euwest1.s3.eu-west-1.amazonaws.com/x",
            "https://cloudformation-custom-resource-response-euwest1.s3.us-east-2.amazonaws.com/x",
            "https://s3.eu-west-1.amazonaws.com.attacker.example/x",
            "https://evils3.eu-west-1.amazonaws.com/x",
            "https://169.254.169.254/latest/meta-data/",
            "https://user:pw@s3.eu-west-1.amazonaws.com/x",
            "https://s3.eu-west-1.amazonaws.com:8443/x",
            "not a url",
        ] {
            assert!(urls.check(bad).is_err(), "{bad}");
        }
        assert_eq!(ResponseUrls::new("cn-north-1", None).check("https://b.s3.cn-north-1.amazonaws.com.cn/x"), Ok(()));
        // `AWS_ENDPOINT_URL_S3` (an emulator's): its origin, and no other.
        let emulator = ResponseUrls::new("us-east-1", Some("http://127.0.0.1:4566".parse().unwrap()));
        assert_eq!(emulator.check("http://127.0.0.1:4566/response?X-Amz-Signature=s"), Ok(()));
        assert!(emulator.check("http://127.0.0.1:4567/response").is_err());
    }
}
