//! Secrets from AWS Secrets Manager (moto's): fetched once, standing in for the
//! plain variables, the database's merged into `DATABASE_URL`; every mistake
//! named without its value.

use aws_sdk_secretsmanager::Client;
use sqlx::Connection;
use webhook_inbox::config::{secrets_manager, Catalog, DbConfig, Env, Secrets};

const STRIPE: &str = "whsec_from_secrets_manager";
const DB_PASSWORD: &str = "db-password-from-secrets-manager";

async fn create(sm: &Client, name: &str, value: &str) -> String {
    sm.create_secret().name(name).secret_string(value).send().await.unwrap().arn().unwrap().to_string()
}

#[tokio::test]
async fn arns_resolve_to_the_plain_variables_and_a_working_database_url() {
    let moto = inbox_tests::Moto::start();
    let sm = Client::new(&moto.aws().await);
    let stripe = create(&sm, "stripe", &format!("{STRIPE},whsec_previous")).await;
    let marqeta = create(
        &sm,
        "marqeta",
        r#"{"MARQETA_WEBHOOK_USERNAME":"mq","MARQETA_WEBHOOK_PASSWORD":["password-one-0123456789","password-two-0123456789"]}"#,
    )
    .await;
    let declared = create(
        &sm,
        "declared",
        r#"{"SLACK_WEBHOOK_SECRET":["slack-new","slack-old"],"TWILIO_WEBHOOK_SECRET":"tw","TWILIO_WEBHOOK_URL":"https://h.example/webhooks/twilio"}"#,
    )
    .await;
    // RDS's managed secret: only the credentials (the local server trusts any password).
    let db = create(&sm, "db", &format!(r#"{{"username":"postgres","password":"{DB_PASSWORD}"}}"#)).await;

    let pairs = [
        ("STRIPE_WEBHOOK_SECRET_ARN", stripe.as_str()),
        ("MARQETA_WEBHOOK_CREDENTIALS_ARN", marqeta.as_str()),
        ("WEBHOOK_SECRETS_ARN", declared.as_str()),
        ("DATABASE_SECRET_ARN", db.as_str()),
        ("DATABASE_URL", "postgres://127.0.0.1:5432/postgres"),
        ("SHOPIFY_WEBHOOK_SECRET", "from-the-environment"),
    ];
    let env = Env::from_pairs(&pairs);
    assert!(secrets_manager::wanted(&env));
    assert!(!secrets_manager::wanted(&Env::from_pairs(&pairs[4..])), "no ARN, no AWS call");
    let env = secrets_manager::resolve(env, &sm).await.unwrap();

    let catalog = Catalog::read(&env).unwrap();
    assert_eq!(
        catalog.url(webhook_inbox::Provider::try_from("twilio").unwrap()),
        Some("https://h.example/webhooks/twilio")
    );
    let secrets = Secrets::read(&env, &catalog).unwrap();
    let slack = &secrets.declared[&webhook_inbox::Provider::try_from("slack").unwrap()];
    assert_eq!(slack.iter().map(|s| s.expose()).collect::<Vec<_>>(), [b"slack-new".as_slice(), b"slack-old"]);
    let stripe: Vec<&[u8]> = secrets.stripe.iter().map(|s| s.expose()).collect();
    assert_eq!(stripe, [STRIPE.as_bytes(), b"whsec_previous"]);
    assert_eq!(secrets.shopify.len(), 1, "plain variables still work beside ARNs");
    let marqeta = secrets.marqeta.expect("Marqeta credentials from one JSON secret");
    assert_eq!((marqeta.username.expose(), marqeta.passwords.len()), (b"mq".as_slice(), 2));

    let url = DbConfig::read(&env, 1).unwrap().url.unwrap();
    assert_eq!(url, format!("postgres://postgres:{DB_PASSWORD}@127.0.0.1:5432/postgres"));
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("the merged URL connects");
    let one: i32 = sqlx::query_scalar("SELECT 1").fetch_one(&mut conn).await.unwrap();
    assert_eq!(one, 1);
}

#[tokio::test]
async fn mistakes_name_the_variable_and_never_the_value() {
    let moto = inbox_tests::Moto::start();
    let sm = Client::new(&moto.aws().await);
    let stripe = create(&sm, "stripe", STRIPE).await;
    let not_rds = create(&sm, "db", &format!(r#"{{"user":"postgres","pass":"{DB_PASSWORD}"}}"#)).await;
    let missing = stripe.replace("stripe", "nonexistent");

    for (pairs, says) in [
        (vec![("STRIPE_WEBHOOK_SECRET_ARN", missing.as_str())], "STRIPE_WEBHOOK_SECRET_ARN: cannot read secret"),
        (
            vec![("STRIPE_WEBHOOK_SECRET_ARN", stripe.as_str()), ("STRIPE_WEBHOOK_SECRET", "whsec_plain")],
            "STRIPE_WEBHOOK_SECRET: set directly and by STRIPE_WEBHOOK_SECRET_ARN",
        ),
        (
            vec![("DATABASE_SECRET_ARN", not_rds.as_str()), ("DATABASE_URL", "postgres://h/db")],
            "DATABASE_SECRET_ARN: needs username and password",
        ),
    ] {
        let err = match secrets_manager::resolve(Env::from_pairs(&pairs), &sm).await {
            Ok(_) => panic!("{pairs:?} resolved"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(says), "{err}");
        for secret in [STRIPE, DB_PASSWORD, "whsec_plain"] {
            assert!(!err.contains(secret), "{err}");
        }
    }
}

/// A response the SDK cannot read (a 200 with a bad `CreatedDate`, a 500 with
/// a body) is named by its status only: the SDK's own error text carries the
/// raw response, and with it the `SecretString`.
#[tokio::test]
async fn an_unreadable_response_is_reported_without_its_body() {
    use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};
    const LEAKED: &str = "whsec_in_a_response_the_sdk_cannot_read";
    for (status, body) in [
        (
            200,
            format!(
                r#"{{"ARN":"arn:aws:secretsmanager:us-east-1:1:secret:s","Name":"s","SecretString":"{LEAKED}","CreatedDate":"not a date"}}"#
            ),
        ),
        (500, format!(r#"{{"SecretString":"{LEAKED}"}}"#)),
        (200, format!("<html>{LEAKED}")),
    ] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(
                ResponseTemplate::new(status)
                    .insert_header("content-type", "application/x-amz-json-1.1")
                    .set_body_string(body),
            )
            .mount(&server)
            .await;
        for (k, v) in
            [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_REGION", "us-east-1")]
        {
            std::env::set_var(k, v);
        }
        let aws = webhook_inbox::config::aws_sdk(Some(&server.uri())).await;
        let sm = Client::from_conf(
            aws_sdk_secretsmanager::config::Builder::from(&aws)
                .retry_config(aws_config::retry::RetryConfig::disabled())
                .build(),
        );
        let pairs = [("STRIPE_WEBHOOK_SECRET_ARN", "arn:aws:secretsmanager:us-east-1:1:secret:s")];
        let err = match secrets_manager::resolve(Env::from_pairs(&pairs), &sm).await {
            Ok(_) => panic!("{status}: resolved"),
            Err(e) => e.to_string(),
        };
        assert!(err.starts_with("STRIPE_WEBHOOK_SECRET_ARN: cannot read secret"), "{status}: {err}");
        assert!(!err.contains(LEAKED), "{status}: {err}");
        assert!(err.contains(&status.to_string()), "{status}: the status is named: {err}");
    }
}

/// The `*_ARN` variables the code resolves.
fn resolved_by_the_code() -> Vec<&'static str> {
    let mut vars: Vec<&str> = secrets_manager::SECRET_ARNS.iter().map(|(var, _)| *var).collect();
    vars.extend([secrets_manager::WEBHOOK_SECRETS_ARN, secrets_manager::DATABASE_SECRET_ARN]);
    vars
}

/// The parameters a YAML value names with `!Ref`.
fn refs(value: &str) -> Vec<String> {
    value
        .split("!Ref ")
        .skip(1)
        .map(|rest| rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == ':').collect())
        .filter(|p: &String| p != "AWS::NoValue")
        .collect()
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// A function's `*_ARN` variables (with the parameters each names) and the
/// parameters its `secretsmanager:GetSecretValue` grants, read off the lines
/// of `template.yaml`'s block for it.
fn arns_and_grants(block: &[&str]) -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let mut arns = Vec::new();
    let mut grants = Vec::new();
    let mut granting: Option<usize> = None;
    for line in block {
        let text = line.trim_start();
        if let Some(at) = granting {
            if indent(line) < at && !text.is_empty() {
                granting = None;
            } else {
                grants.extend(refs(text));
            }
        }
        if text == "Action: secretsmanager:GetSecretValue" {
            granting = Some(indent(line));
        }
        if let Some((var, value)) = text.split_once(": ") {
            if var.ends_with("_ARN") && var.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
                arns.push((var.to_string(), refs(value)));
            }
        }
    }
    (arns, grants)
}

#[test]
fn every_arn_the_template_passes_is_resolved_by_the_code_and_granted_and_every_one_the_code_resolves_is_passed() {
    let template = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../template.yaml")).unwrap();
    let lines: Vec<&str> = template.lines().collect();
    let globals = lines.iter().position(|l| *l == "Globals:").unwrap();
    let resources = lines.iter().position(|l| *l == "Resources:").unwrap();
    let (global_arns, _) = arns_and_grants(&lines[globals..resources]);
    // Each resource: a line of two spaces' indent, up to the next.
    let starts: Vec<usize> = (resources + 1..lines.len())
        .filter(|&i| indent(lines[i]) == 2 && lines[i].trim_end().ends_with(':'))
        .chain([lines.len()])
        .collect();
    let code = resolved_by_the_code();
    let mut passed = std::collections::BTreeSet::new();
    let mut functions = 0;
    for pair in starts.windows(2) {
        let block = &lines[pair[0]..pair[1]];
        if !block.iter().any(|l| l.trim() == "Type: AWS::Serverless::Function") {
            continue;
        }
        functions += 1;
        let name = block[0].trim().trim_end_matches(':');
        let (own, grants) = arns_and_grants(block);
        // A function's own variable of a name the globals set stands in for it.
        let mut all: Vec<(String, Vec<String>)> =
            global_arns.iter().filter(|(var, _)| !own.iter().any(|(v, _)| v == var)).cloned().collect();
        all.extend(own);
        for (var, params) in all {
            assert!(code.contains(&var.as_str()), "{name} is passed {var}, which the code never resolves");
            for param in params {
                assert!(grants.contains(&param), "{name} is passed {var} (!Ref {param}) but not granted to read it");
            }
            passed.insert(var);
        }
    }
    assert!(functions >= 6, "every function was read ({functions})");
    for var in code {
        assert!(passed.contains(var), "the code resolves {var}, but no function of template.yaml is passed it");
    }
}
