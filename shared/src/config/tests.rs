//! Every stage's settings read from an environment a test gives.

use super::{receive::inline_providers, *};
use crate::{
    process::worker::WorkerConfig,
    prune::PruneConfig,
    receive::receiver::ReceiveConfig,
    reconcile::{ReconcileConfig, Reconciler},
    relay::{DestinationLimits, RelayConfig},
};
use webhook_inbox_schemes::Provider;

/// A pool that never connects (no maintenance task, so no runtime needed):
/// what a reader only keeps.
fn unconnected() -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(sqlx::postgres::PgConnectOptions::new())
}

#[test]
fn comma_separated_secrets_are_all_kept_in_order() {
    let s = Secrets::read(&Env::from_pairs(&[("STRIPE_WEBHOOK_SECRET", "whsec_a, whsec_b,,")]), &Catalog::builtin())
        .unwrap();
    let stripe: Vec<&[u8]> = s.stripe.iter().map(Secret::expose).collect();
    assert_eq!(stripe, [b"whsec_a".as_slice(), b"whsec_b"]);
    assert!(!s.is_configured(Provider::SHOPIFY));
}

#[test]
fn standard_secret_must_be_base64_and_the_error_hides_it() {
    let err = Secrets::read(&Env::from_pairs(&[("STANDARD_WEBHOOK_SECRET", "whsec_not*base64")]), &Catalog::builtin())
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("secret #1 is not base64"), "{text}");
    assert!(!text.contains("not*base64"), "{text}");
}

#[test]
fn marqeta_needs_both_username_and_password() {
    let err = Secrets::read(&Env::from_pairs(&[("MARQETA_WEBHOOK_USERNAME", "u")]), &Catalog::builtin()).unwrap_err();
    assert!(err.to_string().contains("MARQETA_WEBHOOK_PASSWORD"));
    let ok = Secrets::read(
        &Env::from_pairs(&[
            ("MARQETA_WEBHOOK_USERNAME", "u"),
            ("MARQETA_WEBHOOK_PASSWORD", "password-one-0123456789,password-two-0123456789"),
        ]),
        &Catalog::builtin(),
    )
    .unwrap();
    assert_eq!(ok.marqeta.unwrap().passwords.len(), 2);
    let short = Secrets::read(
        &Env::from_pairs(&[("MARQETA_WEBHOOK_USERNAME", "u"), ("MARQETA_WEBHOOK_PASSWORD", "short")]),
        &Catalog::builtin(),
    );
    let err = short.unwrap_err().to_string();
    assert!(err.contains("20 to 50") && !err.contains("short"), "{err}");
}

#[test]
fn inline_providers_are_names_and_unknown_ones_are_refused() {
    assert_eq!(
        inline_providers(Some("stripe, marqeta"), &Catalog::builtin()).unwrap(),
        [Provider::STRIPE, Provider::MARQETA]
    );
    assert!(inline_providers(None, &Catalog::builtin()).unwrap().is_empty());
    assert!(inline_providers(Some("stripe,paypal"), &Catalog::builtin()).unwrap_err().to_string().contains("paypal"));
}

#[test]
fn secret_debug_is_redacted() {
    assert_eq!(format!("{:?}", Secret::new("whsec_live")), "Secret(<redacted>)");
}

#[test]
fn development_secrets_cover_every_provider() {
    let s = Secrets::development();
    assert!(Provider::CODED.iter().all(|p| s.is_configured(*p)));
}

#[test]
fn every_stage_reads_its_defaults_from_an_empty_environment() {
    let env = Env::from_pairs(&[]);
    let db = DbConfig::read(&env, 2).unwrap();
    assert_eq!((db.url, db.pool_size, db.statement_timeout), (None, 2, Duration::from_secs(5)));
    let r = ReceiveConfig::read(&env, 2).unwrap();
    assert_eq!((r.max_body_bytes, r.inline_providers.len()), (DEFAULT_MAX_BODY_BYTES, 0));
    assert!(r.secrets.none_configured());
    let w = WorkerConfig::read(&env).unwrap();
    assert_eq!(
        (w.batch_size, w.max_attempts, w.retry_base, w.poll),
        (100, 10, Duration::from_secs(1), Duration::from_millis(200))
    );
    let relay = RelayConfig::read(&env).unwrap();
    assert_eq!((relay.batch_size, relay.lease), (100, Duration::from_secs(300)));
    assert_eq!(DestinationLimits::read(&env).unwrap(), DestinationLimits::default());
    assert_eq!((DestinationLimits::default().concurrency, DestinationLimits::default().max_attempts), (8, 10));
    assert!(Destinations::read(&env).unwrap().is_empty());
    let p = PruneConfig::read(&env).unwrap();
    assert_eq!((p.done_days(Provider::STRIPE), p.failed_days, p.outbox_days, p.batch_size), (60, 180, 7, 1000));
    assert_eq!(ReconcileConfig::read(&env).unwrap().first_lookback, Duration::from_secs(72 * 3600));
    assert!(!Reconciler::read(&env, &crate::App::default(), unconnected()).unwrap().is_configured());
    assert_eq!(deadline_margin(&env).unwrap(), Duration::from_millis(7000));
    assert_eq!(log_settings(&env), (None, false));
}

#[test]
fn each_stage_reads_its_variables_into_its_settings() {
    let pairs = [
        ("DATABASE_URL", "postgres://db/inbox"),
        ("INBOX_DB_POOL_SIZE", "7"),
        ("INBOX_DB_ACQUIRE_TIMEOUT_MS", "11"),
        ("INBOX_LOCK_TIMEOUT_MS", "12"),
        ("INBOX_STATEMENT_TIMEOUT_MS", "13"),
        ("INBOX_IDLE_IN_TRANSACTION_TIMEOUT_MS", "14"),
        ("INBOX_MAX_BODY_BYTES", "2048"),
        ("INBOX_INLINE_PROVIDERS", "stripe, shopify"),
        ("INBOX_PROCESS_QUEUE_URL", "https://sqs.example/process"),
        ("INBOX_BATCH_SIZE", "5"),
        ("INBOX_MAX_ATTEMPTS", "6"),
        ("INBOX_RETRY_BASE_MS", "15"),
        ("INBOX_POLL_MS", "16"),
        ("INBOX_DEADLINE_MARGIN_MS", "170"),
        ("RELAY_HTTP_URL", "https://sink.example/hook"),
        ("RELAY_HTTP_TIMEOUT_MS", "18"),
        ("RELAY_SQS_QUEUE_URL", "https://sqs.example/q"),
        ("RELAY_EVENT_BUS", "bus"),
        ("RELAY_CONCURRENCY", "3"),
        ("RELAY_BATCH_SIZE", "4"),
        ("RELAY_MAX_ATTEMPTS", "9"),
        ("RELAY_RETRY_BASE_MS", "19"),
        ("RELAY_LEASE_MS", "20"),
        ("INBOX_RETENTION_DAYS", "90"),
        ("INBOX_RETENTION_DAYS_STRIPE", "45"),
        ("INBOX_FAILED_RETENTION_DAYS", "200"),
        ("OUTBOX_RETENTION_DAYS", "8"),
        ("INBOX_PRUNE_BATCH", "500"),
        ("RECONCILE_LOOKBACK_HOURS", "24"),
        ("STRIPE_API_KEY", "sk_test_x"),
        ("SHOPIFY_SHOP_DOMAIN", "s.myshopify.com"),
        ("SHOPIFY_ACCESS_TOKEN", "shpat_x"),
        ("GITHUB_API_TOKEN", "ghp_x"),
        ("GITHUB_API_BASE", "https://ghe.example/api/v3"),
        ("GITHUB_HOOKS", "repos/o/r/hooks/1, app"),
        ("RUST_LOG", "debug"),
        ("AWS_LAMBDA_FUNCTION_NAME", "receive"),
    ];
    let env = Env::from_pairs(&pairs);
    let ms = Duration::from_millis;
    let db = DbConfig::read(&env, 2).unwrap();
    assert_eq!(db.url.as_deref(), Some("postgres://db/inbox"));
    assert_eq!(
        (db.pool_size, db.acquire_timeout, db.lock_timeout, db.statement_timeout, db.idle_in_transaction_timeout),
        (7, ms(11), ms(12), ms(13), ms(14))
    );
    let r = ReceiveConfig::read(&env, 2).unwrap();
    assert_eq!((r.max_body_bytes, r.inline_providers), (2048, vec![Provider::STRIPE, Provider::SHOPIFY]));
    assert_eq!(r.process_queue_url.as_deref(), Some("https://sqs.example/process"));
    let w = WorkerConfig::read(&env).unwrap();
    assert_eq!((w.batch_size, w.max_attempts, w.retry_base, w.poll), (5, 6, ms(15), ms(16)));
    assert_eq!(deadline_margin(&env).unwrap(), ms(170), "above the statement timeout (13 ms here)");
    let destinations = Destinations::read(&env).unwrap();
    let [default] = &destinations.0[..] else { panic!("one destination: {destinations:?}") };
    assert_eq!(default.name, "default");
    let Target::Each(each) = &default.target else { panic!("every RELAY_* sink: {default:?}") };
    assert!(matches!(&each[..], [Target::Http { url, signer: None }, Target::Sqs(q), Target::EventBus(b)]
        if url == "https://sink.example/hook" && q == "https://sqs.example/q" && b == "bus"));
    assert_eq!((default.limits.concurrency, default.limits.max_attempts, default.limits.timeout), (3, 9, ms(18)));
    let relay = RelayConfig::read(&env).unwrap();
    assert_eq!((relay.batch_size, relay.retry_base, relay.lease), (4, ms(19), ms(20)));
    let p = PruneConfig::read(&env).unwrap();
    assert_eq!(
        (p.done_days(Provider::STRIPE), p.done_days(Provider::GITHUB), p.failed_days, p.outbox_days, p.batch_size),
        (45, 90, 200, 8, 500)
    );
    assert_eq!(ReconcileConfig::read(&env).unwrap().first_lookback, Duration::from_secs(24 * 3600));
    let reconciler = Reconciler::read(&env, &crate::App::default(), unconnected()).unwrap();
    assert_eq!(reconciler.names(), ["stripe events", "shopify orders", "github repos/o/r/hooks/1", "github app/hook"]);
    let bad = |pairs: &[(&str, &str)]| {
        Reconciler::read(&Env::from_pairs(pairs), &crate::App::default(), unconnected()).err().map(|e| e.to_string())
    };
    assert!(bad(&[("GITHUB_API_TOKEN", "t")]).is_some_and(|e| e.contains("GITHUB_HOOKS")), "a token without hooks");
    assert!(bad(&[("GITHUB_API_TOKEN", "t"), ("GITHUB_HOOKS", "repos/o/r")]).is_some_and(|e| e.contains("not a hook")));
    assert_eq!(log_settings(&env), (Some("debug".into()), true));
}

#[test]
fn declared_providers_come_from_a_file_or_the_variable_with_their_secrets_and_urls() {
    let acme = "[acme]\nsignature = { header = \"X-Acme-Signature\" }\nencoding = \"hex\"\nsigned = \"{url}{body}\"\nredelivery_days = 2\n";
    let path = std::env::temp_dir().join(format!("providers-{}.toml", std::process::id()));
    std::fs::write(&path, acme).unwrap();
    let path = path.to_str().unwrap();
    let acme_p = Provider::try_from("acme").unwrap();
    for source in [("INBOX_PROVIDERS_FILE", path), ("INBOX_PROVIDERS", acme)] {
        let pairs = [
            source,
            ("ACME_WEBHOOK_SECRET", "one, two"),
            ("ACME_WEBHOOK_URL", "https://x.example/prod/webhooks/acme"),
            ("CLERK_WEBHOOK_SECRET", "whsec_Y2xlcmsta2V5"),
            ("SLACK_WEBHOOK_SECRET", "s"),
        ];
        let r = ReceiveConfig::read(&Env::from_pairs(&pairs), 1).unwrap();
        assert_eq!(r.secrets.declared[&acme_p].len(), 2, "comma-separated for rotation");
        assert_eq!(r.catalog.url(acme_p), Some("https://x.example/prod/webhooks/acme"));
        assert_eq!(r.secrets.declared[&Provider::try_from("clerk").unwrap()][0].expose(), b"clerk-key");
        assert!(r.secrets.is_configured(Provider::try_from("slack").unwrap()));
        assert!(!r.secrets.is_configured(Provider::try_from("zoom").unwrap()), "no secret, no route");
        let retention = PruneConfig::read(&Env::from_pairs(&pairs)).unwrap();
        assert!(retention.catalog.get(acme_p).is_some());
    }
    for (pairs, expected) in [
        (
            vec![("INBOX_PROVIDERS", acme), ("ACME_WEBHOOK_SECRET", "k")],
            "ACME_WEBHOOK_URL: missing: acme signs the public URL",
        ),
        (
            vec![("INBOX_PROVIDERS_FILE", "/nonexistent/p.toml")],
            "INBOX_PROVIDERS_FILE: cannot read /nonexistent/p.toml",
        ),
        (vec![("INBOX_PROVIDERS_FILE", path), ("INBOX_PROVIDERS", acme)], "INBOX_PROVIDERS: set together with"),
        (vec![("INBOX_PROVIDERS", "[acme]\nalias = \"x\"")], "INBOX_PROVIDERS: acme: alias \"x\": no such provider"),
        (vec![("RESEND_WEBHOOK_SECRET", "whsec_not*base64")], "RESEND_WEBHOOK_SECRET: secret #1 is not base64"),
        (vec![("TWILIO_WEBHOOK_SECRET", "t")], "TWILIO_WEBHOOK_URL: missing"),
    ] {
        let err = ReceiveConfig::read(&Env::from_pairs(&pairs), 1).unwrap_err().to_string();
        assert!(err.starts_with(expected), "{err}");
        assert!(!err.contains("whsec_not"), "no secret in the error");
    }
    std::fs::remove_file(path).unwrap();
}

/// HMAC takes a key of any length, the empty one included: a bare prefix
/// in a rotation list would verify `HMAC(key = "")`, which anyone can compute.
#[test]
fn an_empty_key_is_refused_on_every_decoding_path() {
    let prefixed = "[acme]\nsignature = { header = \"X-Acme-Signature\" }\nencoding = \"hex\"\nsigned = \"{body}\"\nsecret = { prefix = \"whsec_\" }\nredelivery_days = 1\n";
    let b64 = "[acme]\nsignature = { header = \"X-Acme-Signature\" }\nencoding = \"hex\"\nsigned = \"{body}\"\nsecret = { prefix = \"whsec_\", encoding = \"base64\" }\nredelivery_days = 1\n";
    for (pairs, expected) in [
        (
            vec![("INBOX_PROVIDERS", prefixed), ("ACME_WEBHOOK_SECRET", "whsec_a2V5, whsec_")],
            "ACME_WEBHOOK_SECRET: secret #2 is empty",
        ),
        (vec![("INBOX_PROVIDERS", b64), ("ACME_WEBHOOK_SECRET", "whsec_")], "ACME_WEBHOOK_SECRET: secret #1 is"),
        (vec![("STANDARD_WEBHOOK_SECRET", "whsec_")], "STANDARD_WEBHOOK_SECRET: secret #1 is"),
        (vec![("CLERK_WEBHOOK_SECRET", "whsec_")], "CLERK_WEBHOOK_SECRET: secret #1 is"),
    ] {
        let err = ReceiveConfig::read(&Env::from_pairs(&pairs), 1).map(|_| ()).unwrap_err().to_string();
        assert!(err.starts_with(expected), "{pairs:?}: {err}");
    }
}

#[test]
fn a_value_that_does_not_parse_names_its_variable() {
    for var in ["INBOX_BATCH_SIZE", "RELAY_LEASE_MS", "INBOX_RETENTION_DAYS_MARQETA", "INBOX_DB_POOL_SIZE"] {
        let pairs = [(var, "soon")];
        let env = Env::from_pairs(&pairs);
        let err = match var {
            "INBOX_BATCH_SIZE" => WorkerConfig::read(&env).unwrap_err(),
            "RELAY_LEASE_MS" => RelayConfig::read(&env).unwrap_err(),
            "INBOX_RETENTION_DAYS_MARQETA" => PruneConfig::read(&env).unwrap_err(),
            _ => DbConfig::read(&env, 2).unwrap_err(),
        };
        assert_eq!(err.to_string(), format!("{var}: \"soon\" is not a valid number"));
    }
    let tight = [("INBOX_DEADLINE_MARGIN_MS", "5000")];
    let err = deadline_margin(&Env::from_pairs(&tight)).unwrap_err().to_string();
    assert!(err.contains("not above INBOX_STATEMENT_TIMEOUT_MS (5000 ms)"), "{err}");
    for var in ["INBOX_BATCH_SIZE", "INBOX_MAX_ATTEMPTS", "INBOX_PRUNE_BATCH", "RELAY_BATCH_SIZE", "RELAY_CONCURRENCY"]
    {
        let pairs = [(var, "0")];
        let env = Env::from_pairs(&pairs);
        let err = match var {
            "INBOX_PRUNE_BATCH" => PruneConfig::read(&env).unwrap_err(),
            "RELAY_CONCURRENCY" => DestinationLimits::read(&env).unwrap_err(),
            v if v.starts_with("RELAY") => RelayConfig::read(&env).unwrap_err(),
            _ => WorkerConfig::read(&env).unwrap_err(),
        };
        assert_eq!(err.to_string(), format!("{var}: must be at least 1"), "0 is refused, not raised");
    }
    let short = [("INBOX_RETENTION_DAYS", "2")];
    assert!(PruneConfig::read(&Env::from_pairs(&short)).unwrap_err().to_string().contains("redelivery window"));
}

#[test]
fn relay_signing_secret_signs_the_default_destination_and_needs_its_url() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let signed = [("RELAY_HTTP_URL", "https://consumer.example/hooks"), ("RELAY_SIGNING_SECRET", secret)];
    let read = Destinations::read(&Env::from_pairs(&signed)).unwrap();
    assert!(matches!(&read.0[0].target, Target::Http { signer: Some(_), .. }), "signed");
    let plain = Destinations::read(&Env::from_pairs(&signed[..1])).unwrap();
    assert!(matches!(&plain.0[0].target, Target::Http { signer: None, .. }), "unsigned without it");
    for (pairs, why) in [
        (vec![("RELAY_SIGNING_SECRET", secret)], "which is not set"),
        (vec![signed[0], ("RELAY_SIGNING_SECRET", "not-base64!")], "RELAY_SIGNING_SECRET: "),
    ] {
        let err = Destinations::read(&Env::from_pairs(&pairs)).unwrap_err().to_string();
        assert!(err.contains(why) && !err.contains("MfKQ9r8G"), "{err}");
    }
}

#[test]
fn a_destinations_file_is_read_and_each_mistake_is_refused_naming_its_key() {
    let file = r#"
        [destination.billing]
        url = "https://billing.example/hooks"
        concurrency = 16
        rate_per_second = 50
        timeout_ms = 2500
        max_attempts = 3
        circuit_failures = 4
        circuit_cool_down_ms = 1000
        signing_secret_env = "BILLING_SIGNING_SECRET"

        [destination.audit]
        sqs_queue_url = "https://sqs.example/audit"

        [destination.kafka-events]
        sink = "kafka"
    "#;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let pairs = [("RELAY_DESTINATIONS", file), ("BILLING_SIGNING_SECRET", secret), ("RELAY_CONCURRENCY", "4")];
    let read = Destinations::read(&Env::from_pairs(&pairs)).unwrap();
    let names: Vec<&str> = read.0.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["audit", "billing", "kafka-events"]);
    let billing = &read.0[1];
    assert!(matches!(&billing.target, Target::Http { url, signer: Some(_) } if url == "https://billing.example/hooks"));
    let ms = Duration::from_millis;
    assert_eq!(
        billing.limits,
        DestinationLimits {
            concurrency: 16,
            rate_per_second: Some(50.0),
            timeout: ms(2500),
            max_attempts: 3,
            circuit_failures: 4,
            circuit_cool_down: ms(1000),
        }
    );
    assert_eq!(read.0[0].limits.concurrency, 4, "the RELAY_* variables are every destination's defaults");

    let refused = |file: &str, extra: &[(&'static str, &'static str)]| {
        let file: &'static str = Box::leak(file.to_string().into_boxed_str());
        let mut pairs = vec![("RELAY_DESTINATIONS", file)];
        pairs.extend_from_slice(extra);
        let pairs: &'static [(&str, &str)] = Box::leak(pairs.into_boxed_slice());
        Destinations::read(&Env::from_pairs(pairs)).unwrap_err().to_string()
    };
    for (file, extra, expected) in [
        ("[destination.a]\nurl = \"http://a\"\nconcurency = 3", &[][..], "unknown field `concurency`"),
        (
            "[destination.a]\nurl = \"http://a\"\nconcurrency = 0",
            &[],
            "[destination.a] concurrency: must be at least 1",
        ),
        ("[destination.a]\nurl = \"http://a\"\nconcurrency = \"many\"", &[], "invalid type: string \"many\""),
        (
            "[destination.a]\nurl = \"http://a\"\nrate_per_second = -1.0",
            &[],
            "[destination.a] rate_per_second: \"-1\" is not",
        ),
        ("[destination.a]\nurl = \"ftp://a\"", &[], "[destination.a] url: is not an http:// or https:// URL"),
        ("[destination.a]\nconcurrency = 2", &[], "[destination.a] url: no sink: give one of"),
        ("[destination.a]\nsns_topic_arn = \"alerts\"", &[], "[destination.a] sns_topic_arn: not a topic's ARN"),
        (
            "[destination.a]\nurl = \"http://a\"\nsink = \"k\"",
            &[],
            "[destination.a] sink: a destination has one sink; this one names url, sink",
        ),
        ("[destination.Bad]\nurl = \"http://a\"", &[], "[destination.Bad] name: a destination's name is"),
        (
            "[destination.a]\nurl = \"http://a\"\nsigning_secret_env = \"NOPE\"",
            &[],
            "[destination.a] signing_secret_env: NOPE is not set",
        ),
        (
            "[destination.a]\nurl = \"http://a\"\nsigning_secret_env = \"S\"",
            &[("S", "whsec_!!")],
            "[destination.a] signing_secret_env: S: secret #1 is not base64",
        ),
        (
            "[destination.a]\nsqs_queue_url = \"q\"\nsigning_secret_env = \"S\"",
            &[("S", secret)],
            "[destination.a] signing_secret_env: only an HTTP destination",
        ),
        (
            "[destination.default]\nurl = \"http://a\"",
            &[("RELAY_HTTP_URL", "http://b")],
            "[destination.default] name: is configured by RELAY_HTTP_URL",
        ),
        ("[destinations.a]\nurl = \"http://a\"", &[], "unknown field `destinations`"),
        ("[destination.a]\nurl = \"http://a\"\n[destination.b", &[], "RELAY_DESTINATIONS: line 3, column 15: "),
    ] {
        let err = refused(file, extra);
        assert!(err.starts_with("RELAY_DESTINATIONS: ") && err.contains(expected), "{file}: {err}");
        assert!(!err.contains('\n'), "one line, where and what: {err}");
        assert!(!err.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "never the secret: {err}");
    }
    let both = [("RELAY_DESTINATIONS", "x"), ("RELAY_DESTINATIONS_FILE", "/x")];
    assert!(Destinations::read(&Env::from_pairs(&both)).unwrap_err().to_string().contains("use one or the other"));
}
