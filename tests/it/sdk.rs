//! Our verifiers against the providers' own code (`tests/sdk`, npm and PyPI):
//! where the official SDK signs, its signature goes through the real receive
//! handler and must be accepted (and refused once the body is changed); where
//! it only verifies, our signature of the built-in contract must satisfy it
//! (and a changed body must not), and the same delivery must be accepted here.
//! A disagreement between our reading of the docs and the provider's code fails.

use std::{
    io::Write,
    process::{Command, Stdio},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{postgres::PgConnectOptions, PgPool};
use webhook_inbox::{
    config::{Catalog, Env},
    ReceiveConfig, Receiver,
};
use webhook_inbox_schemes::{
    catalog::Kind,
    declared::{Rules, Source, TimeFormat},
    Delivery, Provider,
};

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Script {
    Node,
    Python,
}

struct Oracle {
    provider: &'static str,
    script: Script,
    /// The SDK can sign; otherwise it only verifies.
    signs: bool,
    body: String,
    form: bool,
    /// The event id the stored row must have.
    event_id: &'static str,
}

const URL_BASE: &str = "https://hooks.example.com/prod/webhooks";

/// A test key pair for SendGrid (ECDSA P-256): the private key signs in tests/sdk, the public key is
/// what SendGrid shows and SENDGRID_WEBHOOK_SECRET holds.
const SENDGRID_PRIVATE: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg9jxfBSqtkVFxGCr4ujiBu1ysaComUMmhn1TbhLFZQtKhRANCAAQV5y7W0SL5pmVNXJfyZJyGVNATupgkZ0VsfNLTlTZzqlWKy3HI9vXe+eCGwBJaj4wm1EcEcVpglsbvX3aLkkjO";
const SENDGRID_PUBLIC: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEFecu1tEi+aZlTVyX8mSchlTQE7qYJGdFbHzS05U2c6pVistxyPb13vnghsASWo+MJtRHBHFaYJbG7192i5JIzg==";

fn secret(provider: &str) -> String {
    match provider {
        "standard" | "clerk" | "resend" | "svix" => format!("whsec_{}", B64.encode(format!("{provider}-signing-key"))),
        "sendgrid" => SENDGRID_PUBLIC.to_string(),
        other => format!("{other}_secret_0123456789"),
    }
}

fn now_ms() -> i64 {
    now() * 1000
}

fn oracles() -> Vec<Oracle> {
    use Script::*;
    let json = |provider, script, signs, body: Value, event_id| Oracle {
        provider,
        script,
        signs,
        body: body.to_string(),
        form: false,
        event_id,
    };
    vec![
        json(
            "sendgrid",
            Node,
            true,
            json!([{"sg_event_id": "sg_sdk_1", "event": "delivered", "email": "a@example.com"}]),
            "sg_sdk_1",
        ),
        json("stripe", Node, true, json!({"id": "evt_sdk", "type": "charge.succeeded", "object": "event"}), "evt_sdk"),
        json("github", Node, true, json!({"action": "opened", "zen": "é ✓"}), "gh-delivery-1"),
        json("standard", Node, true, json!({"type": "user.created", "data": {}}), "msg_sdk_standard"),
        json("svix", Node, true, json!({"type": "message.attempt", "data": {}}), "msg_sdk_svix"),
        json("clerk", Node, true, json!({"type": "user.created", "object": "event", "data": {"id": "user_1"}}), "msg_sdk_clerk"),
        json("resend", Node, true, json!({"type": "email.sent", "data": {"email_id": "e1"}}), "msg_sdk_resend"),
        Oracle {
            provider: "twilio",
            script: Node,
            signs: true,
            body: "AccountSid=AC1&Body=caf%C3%A9+%F0%9F%98%80&From=%2B14158141829&MessageSid=SM1&SmsStatus=received&To=%2B15005550006".into(),
            form: true,
            event_id: "SM1:received",
        },
        json(
            "linear",
            Node,
            false,
            json!({"action": "create", "type": "Issue", "data": {"id": "i1"}, "webhookTimestamp": now_ms()}),
            "linear-delivery-1",
        ),
        json("slack", Python, true, json!({"event_id": "Ev_sdk", "type": "event_callback", "event": {"type": "app_mention"}}), "Ev_sdk"),
        json("hubspot", Python, true, json!([{"eventId": 101, "subscriptionType": "contact.creation", "objectId": 1}]), "101"),
        json("coinbase", Python, true, json!({"id": "wh1", "event": {"id": "cb_evt_1", "type": "charge:confirmed"}}), "cb_evt_1"),
        json("square", Python, false, json!({"event_id": "sq_evt_1", "type": "payment.updated", "data": {}}), "sq_evt_1"),
        json("paddle", Python, false, json!({"event_id": "evt_01pdl", "event_type": "transaction.paid", "data": {}}), "evt_01pdl"),
        json("razorpay", Python, false, json!({"event": "payment.captured", "payload": {}}), "rzp-event-1"),
        json(
            "gocardless",
            Python,
            false,
            json!({"events": [{"id": "EVgc1", "resource_type": "payments", "action": "confirmed"}]}),
            "EVgc1",
        ),
    ]
}

/// One request to the SDK script; its JSON answer.
pub(crate) fn sdk(script: Script, request: Value) -> Value {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk");
    let (program, file) = match script {
        Script::Node => ("node", "sdk.mjs"),
        Script::Python => ("python3", "sdk.py"),
    };
    let mut child = Command::new(program)
        .arg(format!("{dir}/{file}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} is not installed: {e}"));
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{program} {file} failed (the SDKs are installed by `npm ci` in tests/sdk and `pip install -r tests/sdk/requirements.txt`; scripts/test does both): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON answer")
}

/// The headers the provider would send, signed by us: the built-in contract's own signer,
/// or for the coded schemes the test helpers.
fn our_headers(catalog: &Catalog, o: &Oracle, body: &[u8]) -> Vec<(String, String)> {
    let p = Provider::try_from(o.provider).unwrap();
    let key = secret(o.provider);
    let standard = |prefix: &str| {
        let raw = B64.decode(key.trim_start_matches("whsec_")).unwrap();
        let id = format!("msg_sdk_{}", o.provider);
        vec![
            (format!("{prefix}-id"), id.clone()),
            (format!("{prefix}-timestamp"), now().to_string()),
            (format!("{prefix}-signature"), standard_signature(&raw, &id, now(), body)),
        ]
    };
    match &catalog.get(p).unwrap().kind {
        Kind::Coded => match o.provider {
            "stripe" => vec![("stripe-signature".into(), stripe_header(&key, body))],
            "github" => vec![("x-hub-signature-256".into(), github_signature(&key, body))],
            "standard" => standard("webhook"),
            other => panic!("no signer for {other}"),
        },
        Kind::Standard => standard("svix"),
        Kind::Declared(rules) => declared_headers(rules, o, &key, body),
    }
}

fn declared_headers(rules: &Rules, o: &Oracle, key: &str, body: &[u8]) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> = vec![];
    // The signer writes a `{signature:..}` timestamp itself; a header's we send.
    let timestamp = rules.timestamp.as_ref().map(|t| match t.format {
        TimeFormat::UnixMs => now_ms().to_string(),
        _ => now().to_string(),
    });
    if let (Some(Source::Header(h)), Some(ts)) = (rules.timestamp.as_ref().map(|t| &t.from), &timestamp) {
        headers.push((h.clone(), ts.clone()));
    }
    let url = rules.needs_url().then(|| format!("{URL_BASE}/{}", o.provider));
    let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut map = request("x", &pairs, b"").headers().clone();
    if o.form {
        map.insert("content-type", "application/x-www-form-urlencoded".parse().unwrap());
    }
    let delivery = Delivery { headers: &map, body, now: now() };
    let value = rules.sign(key.as_bytes(), &delivery, url.as_deref(), timestamp.as_deref()).unwrap();
    headers.push((rules.headers[0].clone(), value));
    headers
}

/// Headers every delivery of the provider carries beside its signature (ids read from headers).
fn identity_headers(o: &Oracle) -> Vec<(String, String)> {
    let mut h = vec![];
    match o.provider {
        "github" => h.extend([("x-github-delivery", "gh-delivery-1"), ("x-github-event", "issues")]),
        "linear" => h.push(("linear-delivery", "linear-delivery-1")),
        "razorpay" => h.push(("x-razorpay-event-id", "rzp-event-1")),
        _ => {}
    }
    h.push(("content-type", if o.form { "application/x-www-form-urlencoded" } else { "application/json" }));
    h.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn tampered(body: &str) -> String {
    body.replacen("e", "E", 1)
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn every_provider_with_an_official_sdk_agrees_with_it(_: sqlx::postgres::PgPoolOptions, opts: PgConnectOptions) {
    let pool = PgPool::connect_with(opts.clone()).await.unwrap();
    let oracles = oracles();
    let mut vars: Vec<(String, String)> = vec![];
    for o in &oracles {
        let prefix = Provider::try_from(o.provider).unwrap().env_prefix();
        vars.push((format!("{prefix}_WEBHOOK_SECRET"), secret(o.provider)));
        vars.push((format!("{prefix}_WEBHOOK_URL"), format!("{URL_BASE}/{}", o.provider)));
    }
    let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let cfg = ReceiveConfig::read(&Env::from_pairs(&pairs), 4).unwrap();
    let receiver = Receiver::connect_with(opts.clone(), &cfg);

    for o in &oracles {
        let url = format!("{URL_BASE}/{}", o.provider);
        let ask = |op: &str, body: &str, headers: &[(String, String)]| {
            // As HTTP servers hand them over: names lower-cased (Slack's SDK reads them so).
            let headers: serde_json::Map<String, Value> =
                headers.iter().map(|(k, v)| (k.to_lowercase(), Value::String(v.clone()))).collect();
            let request = json!({
                "provider": o.provider, "op": op, "secret": secret(o.provider), "body": body, "url": url,
                "headers": headers, "private_key": SENDGRID_PRIVATE,
            });
            sdk(o.script, request)
        };
        let post_with = |headers: Vec<(String, String)>, body: String| {
            let receiver = &receiver;
            async move {
                let pairs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                post(receiver, o.provider, &pairs, body.as_bytes()).await
            }
        };
        let mut headers = identity_headers(o);
        if o.signs {
            // The SDK signs; the Standard Webhooks senders take our message id.
            let id =
                [("svix-id", format!("msg_sdk_{}", o.provider)), ("webhook-id", format!("msg_sdk_{}", o.provider))];
            let given: Vec<(String, String)> = id.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
            let signed = ask("sign", &o.body, &given);
            let signed = signed["headers"].as_object().unwrap_or_else(|| panic!("{}: {signed}", o.provider));
            headers.extend(signed.iter().map(|(k, v)| (k.to_lowercase(), v.as_str().unwrap().to_string())));
            let (status, answer) = post_with(headers.clone(), tampered(&o.body)).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{}: we accepted a changed body signed by the SDK: {answer}",
                o.provider
            );
        } else {
            headers.extend(our_headers(&cfg.catalog, o, o.body.as_bytes()));
        }
        // Either way the SDK's verifier must accept the delivery, and refuse it changed.
        let verdict = ask("verify", &o.body, &headers);
        assert_eq!(verdict["valid"], true, "{}: the SDK refuses our delivery: {verdict}", o.provider);
        let verdict = ask("verify", &tampered(&o.body), &headers);
        assert_eq!(verdict["valid"], false, "{}: the SDK accepts a changed body, so it proves nothing", o.provider);

        let (status, answer) = post_with(headers.clone(), o.body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{}: {answer}", o.provider);
        let stored: Option<String> =
            sqlx::query_scalar("SELECT status FROM webhook_inbox WHERE provider = $1 AND event_id = $2")
                .bind(o.provider)
                .bind(o.event_id)
                .fetch_optional(&pool)
                .await
                .unwrap();
        assert_eq!(stored.as_deref(), Some("pending"), "{}: the event {} is stored", o.provider, o.event_id);

        // And when we sign it ourselves, the SDK agrees too (the coded schemes and the aliases included;
        // SendGrid's signature needs its private key).
        if o.signs && o.provider != "sendgrid" {
            let mut ours = identity_headers(o);
            ours.extend(our_headers(&cfg.catalog, o, o.body.as_bytes()));
            let verdict = ask("verify", &o.body, &ours);
            assert_eq!(verdict["valid"], true, "{}: the SDK refuses our own signature: {verdict}", o.provider);
        }
    }
}
