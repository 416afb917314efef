//! Secrets from AWS Secrets Manager, read once at start-up.
//!
//! A deployed function gets no secret in its environment, only ARNs: each
//! `*_ARN` variable below names one secret, fetched with `GetSecretValue` when
//! the function starts and kept for the life of the instance. What it fetches
//! stands in for the plain variables it names, so the rest of the
//! configuration reads the same `STRIPE_WEBHOOK_SECRET` whether it came from
//! Secrets Manager or (in `inbox dev` and tests) from the environment.
//!
//! - A single-value secret is its plain text, or a JSON object whose one key is
//!   the variable's name; either may list rotated secrets comma-separated (a
//!   JSON value may also be an array).
//! - Marqeta's credentials are one JSON object with the keys
//!   `MARQETA_WEBHOOK_USERNAME`, `MARQETA_WEBHOOK_PASSWORD` and, optionally,
//!   `MARQETA_WEBHOOK_SECRET`.
//! - `WEBHOOK_SECRETS_ARN` names one JSON object for the declared providers
//!   (Slack, Twilio, a provider of `INBOX_PROVIDERS_FILE`, ...): its keys are
//!   their `<NAME>_WEBHOOK_SECRET` variables, and `<NAME>_WEBHOOK_URL` where a
//!   provider signs its URL.
//! - The database's is RDS's format (`username`, `password`, and optionally
//!   `host`, `port`, `dbname`), RDS's own managed secret included, merged into
//!   `DATABASE_URL` (which then carries no credentials); or a whole URL as plain
//!   text.
//!
//! Errors name the variable and the secret's ARN, never a value.

use std::collections::HashMap;

use aws_sdk_secretsmanager::{
    config::http::HttpResponse,
    error::{DisplayErrorContext, ProvideErrorMetadata, SdkError},
    Client,
};
use serde_json::Value;

use super::{invalid, ConfigError, Env};

/// Each ARN variable and the plain variables its secret may set.
pub const SECRET_ARNS: &[(&str, &[&str])] = &[
    ("STRIPE_WEBHOOK_SECRET_ARN", &["STRIPE_WEBHOOK_SECRET"]),
    ("SHOPIFY_WEBHOOK_SECRET_ARN", &["SHOPIFY_WEBHOOK_SECRET"]),
    ("GITHUB_WEBHOOK_SECRET_ARN", &["GITHUB_WEBHOOK_SECRET"]),
    ("STANDARD_WEBHOOK_SECRET_ARN", &["STANDARD_WEBHOOK_SECRET"]),
    (
        "MARQETA_WEBHOOK_CREDENTIALS_ARN",
        &["MARQETA_WEBHOOK_USERNAME", "MARQETA_WEBHOOK_PASSWORD", "MARQETA_WEBHOOK_SECRET"],
    ),
    ("STRIPE_API_KEY_ARN", &["STRIPE_API_KEY"]),
    ("SHOPIFY_ACCESS_TOKEN_ARN", &["SHOPIFY_ACCESS_TOKEN"]),
    ("GITHUB_API_TOKEN_ARN", &["GITHUB_API_TOKEN"]),
];

/// The declared providers' secrets (and URLs): one JSON object of `<NAME>_WEBHOOK_SECRET` / `_URL` keys.
pub const WEBHOOK_SECRETS_ARN: &str = "WEBHOOK_SECRETS_ARN";

/// The database credentials: RDS's JSON, merged into `DATABASE_URL`.
pub const DATABASE_SECRET_ARN: &str = "DATABASE_SECRET_ARN";

/// Whether any secret is to be fetched (so that a process without one never
/// loads the AWS configuration).
pub fn wanted(env: &Env) -> bool {
    env.var(DATABASE_SECRET_ARN).is_some()
        || env.var(WEBHOOK_SECRETS_ARN).is_some()
        || SECRET_ARNS.iter().any(|(arn, _)| env.var(arn).is_some())
}

/// `env` with every secret its ARN variables name fetched through `client`
/// and standing in for the plain variables.
pub async fn resolve<'a>(env: Env<'a>, client: &Client) -> Result<Env<'a>, ConfigError> {
    let mut set: HashMap<String, String> = HashMap::new();
    let mut fetched: Vec<(&'static str, Vec<(String, String)>)> = Vec::new();
    for &(arn_var, vars) in SECRET_ARNS {
        let Some(arn) = env.var(arn_var) else { continue };
        let text = fetch(client, arn_var, &arn).await?;
        fetched.push((arn_var, values(arn_var, vars, &text)?.into_iter().map(|(k, v)| (k.to_string(), v)).collect()));
    }
    if let Some(arn) = env.var(WEBHOOK_SECRETS_ARN) {
        let text = fetch(client, WEBHOOK_SECRETS_ARN, &arn).await?;
        fetched.push((WEBHOOK_SECRETS_ARN, webhook_values(&text)?));
    }
    for (arn_var, values) in fetched {
        for (var, value) in values {
            if env.var(&var).is_some() || set.contains_key(&var) {
                return Err(invalid(var, format!("set directly and by {arn_var}: keep one")));
            }
            set.insert(var, value);
        }
    }
    if let Some(arn) = env.var(DATABASE_SECRET_ARN) {
        let text = fetch(client, DATABASE_SECRET_ARN, &arn).await?;
        set.insert("DATABASE_URL".into(), database_url(env.var("DATABASE_URL").as_deref(), &text)?);
    }
    Ok(env.overlay(set))
}

async fn fetch(client: &Client, var: &'static str, arn: &str) -> Result<String, ConfigError> {
    let out = client
        .get_secret_value()
        .secret_id(arn)
        .send()
        .await
        .map_err(|e| invalid(var, format!("cannot read secret {arn}: {}", describe(&e))))?;
    out.secret_string
        .ok_or_else(|| invalid(var, format!("secret {arn} has no SecretString (binary secrets are not supported)")))
}

/// What failed, in words that carry no response body: the SDK's own text
/// quotes the raw response, which for a `GetSecretValue` answer it could not
/// read (a malformed 200) is the secret itself.
fn describe<E: ProvideErrorMetadata>(e: &SdkError<E, HttpResponse>) -> String {
    let answered = |status: u16| format!("an answer it could not read (HTTP {status})");
    match e {
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            match (s.err().code(), s.err().message()) {
                // A modelled error: AWS's code and message (not found, access denied, ...).
                (Some(code), Some(message)) => {
                    let message: String =
                        message.chars().take(300).map(|c| if c.is_control() { ' ' } else { c }).collect();
                    format!("{code} (HTTP {status}): {message}")
                }
                (Some(code), None) => format!("{code} (HTTP {status})"),
                (None, _) => answered(status),
            }
        }
        SdkError::ResponseError(r) => answered(r.raw().status().as_u16()),
        SdkError::TimeoutError(_) => "timed out".into(),
        SdkError::DispatchFailure(d) => match d.as_connector_error() {
            // The connection's own error (refused, DNS, TLS): no response was read.
            Some(c) => format!("cannot connect: {}", DisplayErrorContext(c)),
            None => "cannot send the request".into(),
        },
        SdkError::ConstructionFailure(_) => "the request cannot be built (check AWS_REGION)".into(),
        _ => "failed".into(),
    }
}

/// The plain variables one secret sets: its text, or its JSON object's keys.
fn values(
    arn_var: &'static str,
    vars: &[&'static str],
    text: &str,
) -> Result<Vec<(&'static str, String)>, ConfigError> {
    let object = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(object)) => object,
        // Plain text (a secret that happens to be a JSON scalar is plain text too).
        _ if vars.len() == 1 => return Ok(vec![(vars[0], text.trim().to_string())]),
        _ => return Err(invalid(arn_var, format!("must be a JSON object with the keys {}", vars.join(", ")))),
    };
    let mut found = Vec::new();
    for (key, value) in &object {
        let Some(&var) = vars.iter().find(|v| **v == key) else {
            return Err(invalid(arn_var, format!("unexpected key {key:?}; expected {}", vars.join(", "))));
        };
        let value = match value {
            Value::String(s) => s.clone(),
            Value::Array(items) if items.iter().all(Value::is_string) => {
                items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")
            }
            _ => return Err(invalid(arn_var, format!("{key} must be a string or an array of strings"))),
        };
        found.push((var, value));
    }
    if found.is_empty() {
        return Err(invalid(arn_var, format!("the JSON object has none of the keys {}", vars.join(", "))));
    }
    Ok(found)
}

/// `WEBHOOK_SECRETS_ARN`'s object: `<NAME>_WEBHOOK_SECRET` and `<NAME>_WEBHOOK_URL` keys only.
fn webhook_values(text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let var = WEBHOOK_SECRETS_ARN;
    let Ok(Value::Object(object)) = serde_json::from_str::<Value>(text) else {
        return Err(invalid(var, "must be a JSON object of <NAME>_WEBHOOK_SECRET (and <NAME>_WEBHOOK_URL) keys"));
    };
    let coded = SECRET_ARNS.iter().flat_map(|(_, vars)| vars.iter());
    let coded: Vec<&str> = coded.copied().collect();
    let mut found = Vec::new();
    for (key, value) in object {
        let name = key.strip_suffix("_WEBHOOK_SECRET").or_else(|| key.strip_suffix("_WEBHOOK_URL"));
        let valid = name.is_some_and(|n| {
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        });
        if !valid || coded.contains(&key.as_str()) {
            return Err(invalid(
                var,
                format!("unexpected key {key:?}: a declared provider's <NAME>_WEBHOOK_SECRET or <NAME>_WEBHOOK_URL (the five coded providers have their own ARN variables)"),
            ));
        }
        let value = match value {
            Value::String(s) => s,
            Value::Array(items) if items.iter().all(Value::is_string) => {
                items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")
            }
            _ => return Err(invalid(var, format!("{key} must be a string or an array of strings"))),
        };
        found.push((key, value));
    }
    Ok(found)
}

/// `DATABASE_URL` with the secret's credentials (and, where the secret has
/// them, host, port and database name); a plain-text secret is the whole URL.
fn database_url(url: Option<&str>, text: &str) -> Result<String, ConfigError> {
    let var = DATABASE_SECRET_ARN;
    let secret: serde_json::Map<String, Value> = match serde_json::from_str(text) {
        Ok(Value::Object(object)) => object,
        _ if text.trim_start().starts_with("postgres") => {
            return match url {
                Some(_) => Err(invalid(var, "holds a whole URL while DATABASE_URL is set too: keep one")),
                None => Ok(text.trim().to_string()),
            }
        }
        _ => return Err(invalid(var, "must be RDS's JSON (username, password, ...) or a postgres:// URL")),
    };
    let field = |key: &str| -> Result<Option<String>, ConfigError> {
        match secret.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(invalid(var, format!("{key} must be a string"))),
        }
    };
    let (Some(username), Some(password)) = (field("username")?, field("password")?) else {
        return Err(invalid(var, "needs username and password (RDS's secret format)"));
    };
    let mut url = match (url, field("host")?) {
        (Some(url), _) => url::Url::parse(url).map_err(|e| invalid("DATABASE_URL", format!("not a URL: {e}")))?,
        (None, Some(host)) => url::Url::parse(&format!("postgres://{host}/"))
            .map_err(|e| invalid(var, format!("host is not a host name: {e}")))?,
        (None, None) => return Err(invalid("DATABASE_URL", "missing, and the database secret has no host")),
    };
    if url.password().is_some() {
        return Err(invalid("DATABASE_URL", format!("holds a password while {var} is set: keep one")));
    }
    // Host, port and database from the secret fill in what the URL leaves out.
    if let Some(port) = field("port")?.filter(|_| url.port().is_none()) {
        let port = port.parse().map_err(|_| invalid(var, "port is not a port number"))?;
        url.set_port(Some(port)).map_err(|()| invalid("DATABASE_URL", "cannot carry a port"))?;
    }
    if let Some(dbname) = field("dbname")?.filter(|_| matches!(url.path(), "" | "/")) {
        url.set_path(&dbname);
    }
    let refused = |_| invalid("DATABASE_URL", "cannot carry credentials (it has no host)");
    url.set_username(&username).map_err(refused)?;
    url.set_password(Some(&password)).map_err(refused)?;
    Ok(url.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_json_and_arrays_give_the_same_variable() {
        let one = &["STRIPE_WEBHOOK_SECRET"];
        let plain = values("X_ARN", one, " whsec_a,whsec_b\n").unwrap();
        let json = values("X_ARN", one, r#"{"STRIPE_WEBHOOK_SECRET":"whsec_a,whsec_b"}"#).unwrap();
        let array = values("X_ARN", one, r#"{"STRIPE_WEBHOOK_SECRET":["whsec_a","whsec_b"]}"#).unwrap();
        assert_eq!(plain, [("STRIPE_WEBHOOK_SECRET", "whsec_a,whsec_b".to_string())]);
        assert_eq!(plain, json);
        assert_eq!(plain, array);
    }

    #[test]
    fn wrong_shapes_are_refused_without_their_values() {
        let marqeta = SECRET_ARNS[4].1;
        for (text, says) in [
            ("just-a-password", "must be a JSON object"),
            (r#"{"MARQETA_WEBHOOK_USERNAME":"u","password":"hunter2hunter2hunter2"}"#, "unexpected key \"password\""),
            (r#"{"MARQETA_WEBHOOK_PASSWORD":{"nested":"hunter2"}}"#, "must be a string"),
            ("{}", "none of the keys"),
        ] {
            let err = values("MARQETA_WEBHOOK_CREDENTIALS_ARN", marqeta, text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
            assert!(!err.contains("hunter2") && !err.contains("just-a-password"), "{err}");
        }
    }

    #[test]
    fn the_declared_providers_secret_takes_their_variables_only() {
        let ok =
            webhook_values(r#"{"SLACK_WEBHOOK_SECRET":["a","b"],"TWILIO_WEBHOOK_URL":"https://h/webhooks/twilio"}"#);
        let mut ok = ok.unwrap();
        ok.sort();
        assert_eq!(ok[0], ("SLACK_WEBHOOK_SECRET".to_string(), "a,b".to_string()));
        for (text, says) in [
            ("hunter2", "must be a JSON object"),
            (r#"{"STRIPE_WEBHOOK_SECRET":"hunter2"}"#, "the five coded providers have their own"),
            (r#"{"DATABASE_URL":"postgres://hunter2"}"#, "unexpected key \"DATABASE_URL\""),
            (r#"{"slack_webhook_secret":"hunter2"}"#, "unexpected key"),
            (r#"{"SLACK_WEBHOOK_SECRET":{"x":"hunter2"}}"#, "must be a string"),
        ] {
            let err = webhook_values(text).unwrap_err().to_string();
            assert!(err.contains(says) && !err.contains("hunter2\""), "{text}: {err}");
        }
    }

    #[test]
    fn rds_secret_is_merged_into_the_url() {
        let rds = r#"{"username":"inbox","password":"p@ss:w/rd?","engine":"postgres","host":"db.internal","port":5432,"dbname":"inbox"}"#;
        let merged = database_url(Some("postgres://db.example:6432/app?sslmode=verify-full"), rds).unwrap();
        assert_eq!(merged, "postgres://inbox:p%40ss%3Aw%2Frd%3F@db.example:6432/app?sslmode=verify-full");
        // RDS's managed secret holds only the credentials; the URL gives the rest.
        let managed = database_url(Some("postgres://db.example/app"), r#"{"username":"u","password":"p"}"#).unwrap();
        assert_eq!(managed, "postgres://u:p@db.example/app");
        // Without a URL the secret's host, port and database make it.
        assert_eq!(database_url(None, rds).unwrap(), "postgres://inbox:p%40ss%3Aw%2Frd%3F@db.internal:5432/inbox");
        let url: sqlx::postgres::PgConnectOptions = merged.parse().unwrap();
        assert_eq!(url.get_username(), "inbox");
    }

    #[test]
    fn database_secret_mistakes_are_named() {
        let creds = r#"{"username":"u","password":"secret-pw"}"#;
        for (url, text, says) in [
            (Some("postgres://u:other@h/db"), creds, "holds a password"),
            (None, creds, "no host"),
            (Some("postgres://h/db"), r#"{"username":"u"}"#, "needs username and password"),
            (Some("postgres://h/db"), "secret-pw", "must be RDS's JSON"),
            (Some("postgres://h/db"), "postgres://u:secret-pw@h/db", "keep one"),
        ] {
            let err = database_url(url, text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
            assert!(!err.contains("secret-pw") && !err.contains("other"), "{err}");
        }
    }
}
