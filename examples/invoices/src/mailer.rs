//! The team's own sink: receipts to its email provider's API (Postmark's
//! `POST /email/withTemplate`), registered on the app as `mailer` and named by
//! the `email` destination (`destinations.toml`). A sink of one's own is the
//! place for a provider's request format and for what its answers mean.

use std::time::Duration;

use webhook_inbox::{
    serde_json::json,
    sinks::{http_client, Outgoing, RepliesFuture, Sink, SinkReply},
};

/// Sends each `send_email` message as one templated email.
pub struct Mailer {
    client: reqwest::Client,
    base: String,
    token: String,
}

impl Mailer {
    /// Postmark's API at `base` (`https://api.postmarkapp.com`), with the server `token`.
    pub fn new(base: impl Into<String>, token: impl Into<String>) -> Self {
        // As the built-in sinks' (TLS by rustls, no redirects); building one only fails without TLS roots.
        let client = http_client(Duration::from_secs(10)).expect("an HTTP client");
        Mailer { client, base: base.into(), token: token.into() }
    }

    /// `MAILER_API_URL` (Postmark's by default) and `MAILER_API_TOKEN`.
    pub fn from_env() -> Self {
        let base = std::env::var("MAILER_API_URL").unwrap_or_else(|_| "https://api.postmarkapp.com".into());
        Mailer::new(base, std::env::var("MAILER_API_TOKEN").unwrap_or_default())
    }

    async fn send(&self, m: &Outgoing) -> SinkReply {
        let p = &m.payload.0;
        let email = json!({
            "From": "billing@example.com",
            "To": p["to"],
            "TemplateAlias": p["template"],
            "TemplateModel": p,
            // Postmark has no idempotency key: the key rides along, for the team's own deduplication.
            "Metadata": {"message_key": m.message_key},
        });
        let sent = self
            .client
            .post(format!("{}/email/withTemplate", self.base))
            .header("X-Postmark-Server-Token", &self.token)
            .json(&email)
            .send()
            .await;
        let status = match sent {
            Ok(r) => r.status().as_u16(),
            Err(e) => return SinkReply::retry(format!("mail API unreachable: {}", e.without_url())),
        };
        match status {
            200..=299 => SinkReply::Delivered,
            // A bad token is the destination's fault, not the message's: retried (and the circuit opens).
            401 | 403 | 429 | 500.. => SinkReply::retry(format!("mail API answered {status}")),
            // An invalid address or template will never be sent.
            _ => SinkReply::Rejected(format!("mail API refused the email: {status}")),
        }
    }
}

impl Sink for Mailer {
    fn target(&self) -> String {
        format!("mailer {}", self.base)
    }

    fn deliver<'a>(&'a self, messages: &'a [Outgoing]) -> RepliesFuture<'a> {
        Box::pin(async move {
            let mut replies = Vec::with_capacity(messages.len());
            for m in messages {
                replies.push(self.send(m).await);
            }
            replies
        })
    }
}
