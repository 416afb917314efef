use super::*;
use crate::{
    catalog::{Catalog, Kind},
    github::Github,
    shopify::Shopify,
    standard::Standard,
    stripe::Stripe,
    test_support::{headers, now},
    InitialStatus, RejectionKind,
};

fn rules(toml_text: &str) -> Result<Rules, String> {
    let d: Description = toml::from_str(toml_text).map_err(|e| e.to_string())?;
    Rules::from_description(&d)
}

fn builtin(name: &str) -> Rules {
    match &Catalog::builtin().get(Provider::try_from(name).unwrap()).unwrap().kind {
        Kind::Declared(r) => (**r).clone(),
        other => panic!("{name} is {other:?}"),
    }
}

fn scheme(rules: Rules, secrets: &[&str], url: Option<&str>) -> Declared {
    let secrets = secrets.iter().map(|s| Secret::new(s.as_bytes())).collect();
    Declared::new(Provider::try_from("acme").unwrap(), rules, secrets, url.map(str::to_string))
}

fn delivery<'a>(h: &'a http::HeaderMap, body: &'a [u8]) -> Delivery<'a> {
    Delivery { headers: h, body, now: now() }
}

fn single(events: Events) -> NewEvent {
    match events {
        Events::Single(e) => e,
        Events::Batch(b) => panic!("a batch: {b:?}"),
    }
}

#[test]
fn the_builtin_catalog_is_valid_and_names_every_provider_of_the_issue() {
    let c = Catalog::builtin();
    let names: Vec<&str> = c.entries().map(|e| e.provider.as_str()).collect();
    for name in [
        "slack",
        "twilio",
        "paddle",
        "square",
        "linear",
        "intercom",
        "hubspot",
        "zoom",
        "twitch",
        "woocommerce",
        "typeform",
        "zendesk",
        "calendly",
        "coinbase",
        "razorpay",
        "gocardless",
        "segment",
        "docusign",
        "clerk",
        "resend",
        "svix",
        "sendgrid",
        "stripe",
        "shopify",
        "marqeta",
        "github",
        "standard",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    assert_eq!(names.len(), 27);
    assert!(matches!(c.get(Provider::try_from("clerk").unwrap()).unwrap().kind, Kind::Standard));
    for name in ["twilio", "square", "hubspot"] {
        assert!(builtin(name).needs_url(), "{name} signs its URL");
    }
}

#[test]
fn a_description_is_checked_with_a_reason_a_user_can_act_on() {
    let base = r#"signature = { header = "X-Sig" }
encoding = "hex"
signed = "{body}"
"#;
    assert!(rules(base).is_ok());
    for (extra_or_replaced, expected) in [
        ("signed = \"{timestamp}\"", "does not cover the body"),
        ("signed = \"{bdy}\"", "unknown placeholder {bdy}"),
        ("signed = \"{timestamp}.{body}\"", "no timestamp = { from = ... }"),
        ("signed = \"{body\"", "is not closed"),
        ("signed = \"{body}{body\"", "is not closed"),
        ("signed = \"}{body}\"", "has no '{'"),
        ("signed = \"{json:/id}{body}\"", "cannot be signed"),
        ("encoding = \"base32\"", "neither hex nor base64"),
        ("algorithm = \"md5\"", "not one of sha1, sha256, sha512"),
        ("event_id = \"{body}\"", "cannot be read here"),
        ("event_id = \"{json:id}\"", "starts with '/'"),
        ("signature = { header = \"X Sig\" }", "not a header name"),
        ("signature = { header = \"X-Sig\", items = \",\" }", "needs both items"),
        ("timestamp = { from = \"{signature:t}\" }", "needs a key-value list"),
        ("timestamp = { from = \"{header:T}\", format = \"iso\" }", "not one of unix, unix-ms, rfc3339"),
        ("batch = \"events\"", "not a JSON pointer"),
        ("secret = { encoding = \"hex\" }", "neither utf8 nor base64"),
    ] {
        let key = extra_or_replaced.split(" =").next().unwrap();
        let text: String =
            base.lines().filter(|l| !l.starts_with(&format!("{key} ="))).map(|l| format!("{l}\n")).collect();
        let err = rules(&format!("{text}{extra_or_replaced}\n")).unwrap_err();
        assert!(err.contains(expected), "{extra_or_replaced}: {err}");
    }
    let err =
        rules("signature = { header = \"X\" }\nencoding = \"hex\"\nsigned = \"{body}\"\nsignd = \"\"").unwrap_err();
    assert!(err.contains("unknown field `signd`"), "{err}");
}

#[test]
fn a_providers_file_adds_replaces_and_aliases_and_its_mistakes_are_named() {
    let file = r#"
[acme]
signature = { header = "X-Acme-Signature", prefix = "sha256=" }
encoding = "hex"
signed = "{body}"
redelivery_days = 3

[acme-eu]
alias = "acme"
redelivery_days = 5

[polar]
alias = "standard"

[a-polar-eu]
alias = "polar"

[slack]
signature = { header = "X-Slack-Signature", prefix = "v0=" }
encoding = "hex"
signed = "{body}"
redelivery_days = 9
"#;
    let c = Catalog::with_file(Some(file), |_| None).unwrap();
    let get = |n: &str| c.get(Provider::try_from(n).unwrap()).unwrap();
    assert!(get("acme").configured && matches!(get("acme").kind, Kind::Declared(_)));
    assert_eq!((get("acme").redelivery_days, get("acme-eu").redelivery_days), (3, 5));
    assert!(matches!(get("polar").kind, Kind::Standard));
    assert_eq!(get("polar").redelivery_days, 3, "an alias inherits the window");
    assert!(matches!(get("a-polar-eu").kind, Kind::Standard), "an alias of an alias, named before it");
    assert_eq!(get("slack").redelivery_days, 9, "a file may correct a built-in without a release");

    for (file, expected) in [
        ("[stripe]\nalias = \"standard\"", "stripe: a provider with code of its own cannot be redeclared"),
        ("[Acme]\nalias = \"standard\"", "\"Acme\": not a provider name"),
        ("[a]\nalias = \"nope\"", "a: alias \"nope\": no such provider"),
        ("[a]\nalias = \"marqeta\"", "only standard and declared providers can be aliased"),
        ("[a]\nalias = \"slack\"\nencoding = \"hex\"", "an alias takes only redelivery_days"),
        (
            "[a]\nsignature = { header = \"X\" }\nencoding = \"hex\"\nsigned = \"{body}\"",
            "a: redelivery_days is missing",
        ),
        ("[a\n", "not valid TOML: line 1, column 3: "),
        ("{\"a\": {\"alias\": 1}}", "not valid JSON"),
    ] {
        let err = Catalog::with_file(Some(file), |_| None).unwrap_err();
        assert!(err.contains(expected), "{file}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
    let json = r#"{"acme": {"signature": {"header": "X-Sig"}, "encoding": "base64", "signed": "{body}", "redelivery_days": 1}}"#;
    assert!(Catalog::with_file(Some(json), |_| None).unwrap().find("acme").is_some(), "JSON works too");
}

#[test]
fn templates_read_literals_placeholders_and_escaped_braces() {
    let t = Template::parse("v0:{timestamp}:{{x}}{header:X-Id}{body}").unwrap();
    assert_eq!(
        t.0,
        [
            Part::Literal("v0:".into()),
            Part::Source(Source::Timestamp),
            Part::Literal(":{x}".into()),
            Part::Source(Source::Header("X-Id".into())),
            Part::Source(Source::Body),
        ]
    );
    assert!(Template::parse("{header:}").unwrap_err().contains("needs a header name"));
    assert!(Template::parse("{body:x}").unwrap_err().contains("takes no argument"));
}

#[test]
fn rfc3339_times_are_read_exactly() {
    for (text, want) in [
        ("1970-01-01T00:00:00Z", Some(0)),
        ("2021-07-25T10:00:00Z", Some(1_627_207_200)),
        ("2019-11-16T10:11:12.634234626Z", Some(1_573_899_072)),
        ("2024-02-29T23:59:59+01:00", Some(1_709_247_599)),
        ("2024-02-29T23:59:59-00:30", Some(1_709_252_999)),
        ("2024-13-01T00:00:00Z", None),
        ("2024-01-01T00:00:00", None),
        ("2024-01-01T00:00:00.Z", None),
        ("yesterday", None),
        ("", None),
    ] {
        assert_eq!(parse_time(text, TimeFormat::Rfc3339), want, "{text}");
    }
    assert_eq!(parse_time("1700000000123", TimeFormat::UnixMs), Some(1_700_000_000));
    assert_eq!(parse_time("-1", TimeFormat::Unix), None);
    assert_eq!(parse_time("99999999999999999999", TimeFormat::Unix), None, "no overflow");
}

/// What a timestamp is written as is what it is read back as, in every format
/// (leap days, the ends of years, the epoch and far ahead).
#[test]
fn timestamps_are_written_as_they_are_read() {
    assert_eq!(format_time(1_627_207_200, TimeFormat::Rfc3339), "2021-07-25T10:00:00Z");
    assert_eq!(format_time(1_700_000_000, TimeFormat::UnixMs), "1700000000000");
    for secs in [0, 1_709_251_199, 1_709_251_200, 1_735_689_599, 951_782_400, 4_102_444_800, 1_764_772_345] {
        for format in [TimeFormat::Unix, TimeFormat::UnixMs, TimeFormat::Rfc3339] {
            assert_eq!(parse_time(&format_time(secs, format), format), Some(secs), "{secs} {format:?}");
        }
    }
}

#[test]
fn json_pointers_read_strings_numbers_and_escaped_keys_but_not_containers() {
    let body = br#"{"a":{"b/c":[10,{"d~e":"x\u00e9"}]},"n":12345678901234567890123,"o":{},"z":null,"s":""}"#;
    assert_eq!(json_text(body, "/a/b~1c/1/d~0e").as_deref(), Some("xé"));
    assert_eq!(json_text(body, "/a/b~1c/0").as_deref(), Some("10"));
    assert_eq!(
        json_text(br#"{"id":"first","x":[1,[2]],"id":"last"}"#, "/id").as_deref(),
        Some("last"),
        "as jsonb keeps"
    );
    assert_eq!(json_text(br#"{"id":"x"} trailing"#, "/id"), None, "not JSON");
    assert_eq!(json_text(body, "/n").as_deref(), Some("12345678901234567890123"), "a huge number keeps its digits");
    for absent in ["/o", "/z", "/s", "/a/b~1c/01", "/a/b~1c/9", "/missing", "/a/b~1c/-1"] {
        assert_eq!(json_text(body, absent), None, "{absent}");
    }
    let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(json_text(deep.as_bytes(), "/0/0"), None, "deep nesting is refused, not a stack overflow");
}

/// The coded schemes, and the same contracts written as data, judge every delivery alike.
#[test]
fn the_coded_providers_are_expressible_as_declared_ones() {
    let stripe = rules(STRIPE_AS_DATA).unwrap();
    let shopify = rules(
        r#"signature = { header = "X-Shopify-Hmac-Sha256" }
encoding = "base64"
signed = "{body}"
event_id = "{header:X-Shopify-Webhook-Id}"
event_type = "{header:X-Shopify-Topic}""#,
    )
    .unwrap();
    let github = rules(
        r#"signature = { header = "X-Hub-Signature-256", prefix = "sha256=" }
encoding = "hex"
signed = "{body}"
event_id = "{header:X-GitHub-Delivery}"
event_type = ["{header:X-GitHub-Event}.{json:/action}", "{header:X-GitHub-Event}"]"#,
    )
    .unwrap();
    let standard = rules(
        r#"signature = { header = "webhook-signature", items = " ", pairs = ",", key = "v1" }
secret = { encoding = "base64", prefix = "whsec_" }
encoding = "base64"
signed = "{header:webhook-id}.{timestamp}.{body}"
timestamp = { from = "{header:webhook-timestamp}", tolerance_secs = 300 }
event_id = "{header:webhook-id}"
event_type = "{json:/type}""#,
    )
    .unwrap();
    let keys = ["key-old", "key-new"];
    let b64_keys: Vec<String> = keys.iter().map(|k| format!("whsec_{}", B64.encode(k))).collect();
    let standard_keys: Vec<Secret> = b64_keys.iter().map(|k| standard.decode_secret(k).unwrap()).collect();
    let secrets = || keys.iter().map(|k| Secret::new(k.as_bytes())).collect::<Vec<_>>();
    let declared = |r: &Rules, s: Vec<Secret>| Declared::new(Provider::STRIPE, r.clone(), s, None);
    let pairs: Vec<(Box<dyn Scheme>, Declared, Rules, &str)> = vec![
        (Box::new(Stripe::new(secrets())), declared(&stripe, secrets()), stripe.clone(), "stripe"),
        (Box::new(Shopify::new(secrets())), declared(&shopify, secrets()), shopify.clone(), "shopify"),
        (Box::new(Github::new(secrets())), declared(&github, secrets()), github.clone(), "github"),
        (
            Box::new(Standard::new(standard_keys.clone())),
            declared(&standard, standard_keys),
            standard.clone(),
            "standard",
        ),
    ];
    let body = br#"{"id":"evt_1","type":"order.paid","action":"opened"}"#;
    let t = now().to_string();
    let stale = (now() - 301).to_string();
    let common = [
        ("x-shopify-webhook-id", "wh-1"),
        ("x-shopify-topic", "orders/paid"),
        ("x-github-delivery", "gh-1"),
        ("x-github-event", "issues"),
        ("webhook-id", "msg_1"),
        ("content-type", "application/json"),
    ];
    for (coded, decl, rules, name) in &pairs {
        let mut cases: Vec<(String, http::HeaderMap, Vec<u8>)> = Vec::new();
        for (label, key, ts, tamper) in [
            ("old key", keys[0], &t, false),
            ("new key", keys[1], &t, false),
            ("unknown key", "other", &t, false),
            ("tampered body", keys[0], &t, true),
            ("stale", keys[0], &stale, false),
        ] {
            let mut h: Vec<(&str, &str)> = common.to_vec();
            h.push(("webhook-timestamp", ts));
            let hm = headers(&h);
            let value = rules.sign(key.as_bytes(), &delivery(&hm, body), None, Some(ts)).unwrap();
            let header_name = rules.headers[0].clone();
            h.push((&header_name, &value));
            let sent: Vec<u8> =
                if tamper { body.iter().map(|b| if *b == b'1' { b'2' } else { *b }).collect() } else { body.to_vec() };
            cases.push((label.to_string(), headers(&h), sent));
        }
        cases.push(("no signature".into(), headers(&common), body.to_vec()));
        let mut garbage = common.to_vec();
        garbage.push((rules.headers[0].as_str(), "t=1,v1=zz sha256=zz v1,%%"));
        cases.push(("garbage".into(), headers(&garbage), body.to_vec()));
        for (label, h, sent) in &cases {
            let d = delivery(h, sent);
            let (a, b) = (coded.verify(&d), decl.verify(&d));
            let expected =
                matches!(label.as_str(), "old key" | "new key") || (label == "stale" && rules.timestamp.is_none());
            assert_eq!(a.is_ok(), expected, "{name}, {label}: {a:?}");
            assert_eq!(a.is_ok(), b.is_ok(), "{name}, {label}: coded {a:?}, declared {b:?}");
            if let (Ok(a), Ok(b)) = (&a, &b) {
                assert_eq!(a, b, "{name}, {label}: the same secret matched");
            }
            if let (Err(a), Err(b)) = (&a, &b) {
                assert_eq!(a.kind(), b.kind(), "{name}, {label}: {a} / {b}");
            }
            let (ea, eb) = (single(coded.events(&d)), single(decl.events(&d)));
            assert_eq!(
                (&ea.event_id, &ea.event_type, ea.status),
                (&eb.event_id, &eb.event_type, eb.status),
                "{name}, {label}"
            );
        }
    }
}

#[test]
fn twilio_signs_its_url_and_sorted_form_and_the_payload_is_the_fields() {
    let r = builtin("twilio");
    let url = "https://example.com/prod/webhooks/twilio?x=1";
    let body = b"To=%2B15005550006&From=%2B14158141829&Body=Hi+there%26&MessageSid=SM1&MessageStatus=delivered";
    let h = headers(&[("content-type", "application/x-www-form-urlencoded")]);
    // twilio-node: url, then each sorted key followed by its value.
    let expected_message =
        format!("{url}BodyHi there&From+14158141829MessageSidSM1MessageStatusdeliveredTo+15005550006");
    let msg = r.message(&delivery(&h, body), Some(url), "").unwrap().concat();
    assert_eq!(String::from_utf8(msg).unwrap(), expected_message);
    let sig = r.sign(b"token", &delivery(&h, body), Some(url), None).unwrap();
    let signed = headers(&[("content-type", "application/x-www-form-urlencoded"), ("x-twilio-signature", &sig)]);
    let s = scheme(r.clone(), &["token"], Some(url));
    assert!(s.verify(&delivery(&signed, body)).is_ok());
    let elsewhere = scheme(r, &["token"], Some("https://example.com/other/webhooks/twilio?x=1"));
    assert!(elsewhere.verify(&delivery(&signed, body)).is_err(), "the URL is signed");
    let e = single(s.events(&delivery(&signed, body)));
    assert_eq!(
        (e.event_id.as_str(), e.event_type.as_str(), e.status),
        ("SM1:delivered", "message.delivered", InitialStatus::Pending)
    );
    let payload: serde_json::Value = serde_json::from_str(e.payload.as_deref().unwrap()).unwrap();
    assert_eq!(payload["Body"], "Hi there&");
}

#[test]
fn a_batch_is_one_event_per_element_and_a_bad_element_fails_alone() {
    let r = builtin("gocardless");
    let body = br#"{"events":[{"id":"EV1","resource_type":"payments","action":"confirmed"},{"id":"EV2","resource_type":"mandates"},{"resource_type":"payouts","n":1e999},{"id":"EV1","resource_type":"payments","action":"confirmed"}]}"#;
    let s = scheme(r.clone(), &["k"], None);
    let Events::Batch(events) = s.events(&delivery(&headers(&[]), body)) else { panic!("a batch") };
    let summary: Vec<(&str, &str, InitialStatus)> =
        events.iter().map(|e| (e.event_id.as_str(), e.event_type.as_str(), e.status)).collect();
    assert_eq!(summary[0], ("EV1", "payments.confirmed", InitialStatus::Pending));
    assert_eq!(summary[1], ("EV2", "mandates", InitialStatus::Pending));
    assert!(summary[2].0.starts_with("sha256:") && summary[2].2 == InitialStatus::Failed, "{:?}", summary[2]);
    assert_eq!(summary[3].0, "EV1", "a repeated element is the same event (the claim keeps one)");

    let many = format!("{{\"events\":[{}]}}", vec!["{\"id\":\"x\"}"; MAX_BATCH_ITEMS + 1].join(","));
    let Events::Batch(whole) = s.events(&delivery(&headers(&[]), many.as_bytes())) else { panic!("a batch") };
    assert_eq!(whole.len(), 1);
    assert!(whole[0].failure_reason.as_deref().unwrap().contains("over the limit"), "{whole:?}");
    for odd in [&br#"{"events":{}}"#[..], b"[1,2]", b"not json"] {
        let Events::Batch(one) = s.events(&delivery(&headers(&[]), odd)) else { panic!("a batch") };
        assert_eq!((one.len(), one[0].status), (1, InitialStatus::Failed), "{}", String::from_utf8_lossy(odd));
    }
}

#[test]
fn ids_fall_back_in_order_and_to_the_body_digest() {
    let s = scheme(builtin("slack"), &["k"], None);
    let events = |h: &[(&str, &str)], body: &[u8]| single(s.events(&delivery(&headers(h), body)));
    let e = events(&[], br#"{"event_id":"Ev1","type":"event_callback","event":{"type":"app_mention"}}"#);
    assert_eq!((e.event_id.as_str(), e.event_type.as_str()), ("Ev1", "app_mention"));
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let e = events(&form, b"command=%2Fweather&text=94070");
    assert!(e.event_id.starts_with("sha256:"), "a slash command has no id: {e:?}");
    assert_eq!((e.event_type.as_str(), e.status), ("command:/weather", InitialStatus::Pending));
    let e = events(&[], br#"{"event_id":"","type":"x"}"#);
    assert!(e.event_id.starts_with("sha256:"), "an empty id is no id");
    let long = format!(r#"{{"event_id":"{}"}}"#, "x".repeat(300));
    let e = events(&[], long.as_bytes());
    assert_eq!(e.status, InitialStatus::Failed, "an id over 255 characters is refused, keyed by the digest");
    let e = events(&[], b"{\"event_id\":\"E\\u0000\"}");
    assert_eq!(e.status, InitialStatus::Failed, "jsonb cannot store \\u0000");
}

#[test]
fn a_signed_timestamp_without_a_tolerance_is_refused_at_start_up() {
    let base = "signature = { header = \"X\" }\nencoding = \"hex\"\nsigned = \"{timestamp}.{body}\"\n";
    for timestamp in ["{ from = \"{header:X-T}\" }", "{ from = \"{header:X-T}\", tolerance_secs = 0 }"] {
        let err = rules(&format!("{base}timestamp = {timestamp}\n")).unwrap_err();
        assert!(err.starts_with("timestamp.tolerance_secs is missing"), "{timestamp}: {err}");
    }
    assert!(rules(&format!("{base}timestamp = {{ from = \"{{header:X-T}}\", tolerance_secs = 300 }}\n")).is_ok());
}

#[test]
fn timestamps_are_checked_where_the_contract_says() {
    // Linear: milliseconds inside the signed body, 60 s either way.
    let s = scheme(builtin("linear"), &["k"], None);
    let ms = |secs: i64| format!(r#"{{"type":"Issue","action":"create","webhookTimestamp":{}}}"#, secs * 1000);
    for (body, ok) in
        [(ms(now()), true), (ms(now() - 61), false), (ms(now() + 61), false), (r#"{"type":"Issue"}"#.into(), false)]
    {
        let sig = builtin("linear").sign(b"k", &delivery(&headers(&[]), body.as_bytes()), None, None).unwrap();
        let h = headers(&[("linear-signature", &sig)]);
        let result = s.verify(&delivery(&h, body.as_bytes()));
        assert_eq!(result.is_ok(), ok, "{body}: {result:?}");
    }
    // Twitch: RFC 3339 in a header, 10 minutes.
    let r = builtin("twitch");
    let s = scheme(r.clone(), &["k"], None);
    let body = br#"{"subscription":{"type":"channel.follow"}}"#;
    for ts in ["2020-01-01T00:00:00.123456789Z", "not a time"] {
        let h = headers(&[("twitch-eventsub-message-id", "m1"), ("twitch-eventsub-message-timestamp", ts)]);
        let sig = r.sign(b"k", &delivery(&h, body), None, Some(ts)).unwrap();
        let h = headers(&[
            ("twitch-eventsub-message-id", "m1"),
            ("twitch-eventsub-message-timestamp", ts),
            ("twitch-eventsub-message-signature", &sig),
        ]);
        let reason = s.verify(&delivery(&h, body)).unwrap_err().to_string();
        assert!(reason.contains("timestamp (Twitch-Eventsub-Message-Timestamp header) is"), "{ts}: {reason}");
    }
}

/// What identifies an event comes from the signed bytes where the provider
/// puts it there: a captured Twitch notification sent again with another
/// (unsigned) Subscription-Type header keeps its own type.
#[test]
fn an_unsigned_header_does_not_change_what_the_signed_body_says() {
    let r = builtin("twitch");
    let s = scheme(r.clone(), &["k"], None);
    let body = br#"{"subscription":{"type":"channel.follow"},"event":{"user_id":"1"}}"#;
    let t = "2026-12-01T00:00:00Z".to_string();
    let at = parse_time(&t, TimeFormat::Rfc3339).unwrap();
    let base = [("twitch-eventsub-message-id", "m1"), ("twitch-eventsub-message-timestamp", t.as_str())];
    let sig = r.sign(b"k", &delivery(&headers(&base), body), None, Some(&t)).unwrap();
    let mut h = base.to_vec();
    h.extend([
        ("twitch-eventsub-message-signature", sig.as_str()),
        ("twitch-eventsub-subscription-type", "channel.ban"),
    ]);
    let h = headers(&h);
    let d = Delivery { headers: &h, body, now: at };
    assert!(s.verify(&d).is_ok());
    assert_eq!(single(s.events(&d)).event_type, "channel.follow");
}

#[test]
fn a_challenge_is_checked_like_the_rest() {
    let base = "signature = { header = \"X\" }\nencoding = \"hex\"\nsigned = \"{body}\"\n";
    for (challenge, expected) in [
        ("{ when = \"{json:/type}\", equals = \"x\" }", "needs respond (text) or respond_json"),
        ("{ when = \"{json:/type}\", equals = \"x\", respond = \"a\", respond_json = {} }", "one of them"),
        ("{ when = \"{hmac:/t}\", equals = \"x\", respond = \"a\" }", "challenge.when: Hmac"),
        (
            "{ when = \"{json:/type}\", equals = \"x\", respond = \"{body}\" }",
            "challenge.respond: Body cannot be read here",
        ),
        ("{ when = \"{json:/type}\", equals = \"x\", respond = \"{hmac:t}\" }", "needs a JSON pointer"),
        (
            "{ when = \"{json:/type}\", equals = \"x\", respond_json = { k = \"{url}\" } }",
            "challenge.respond_json.k: Url",
        ),
    ] {
        let err = rules(&format!("{base}challenge = {challenge}\n")).unwrap_err();
        assert!(err.contains(expected), "{challenge}: {err}");
    }
    let r = rules(&format!(
        "{base}challenge = {{ when = \"{{json:/type}}\", equals = \"hs\", respond = \"{{json:/c}}\" }}\n"
    ));
    let s = scheme(r.unwrap(), &["k"], None);
    let d = |body: &'static [u8]| (headers(&[]), body);
    let (h, body) = d(br#"{"type":"hs","c":"back"}"#);
    let verified = Verified { secret_index: 0 };
    assert_eq!(s.challenge(&delivery(&h, body), verified).unwrap().body, "back");
    let (h, body) = d(br#"{"type":"event","c":"back"}"#);
    assert!(s.challenge(&delivery(&h, body), verified).is_none(), "not a handshake: an event like any other");
    let (h, body) = d(br#"{"type":"hs"}"#);
    assert!(
        s.challenge(&delivery(&h, body), verified).is_none(),
        "a handshake with nothing to answer is kept, not dropped"
    );
}

#[test]
fn only_an_unsigned_form_of_exactly_the_ping_fields_is_a_ping() {
    let base = "signature = { header = \"X-Sig\" }\nencoding = \"hex\"\nsigned = \"{body}\"\n";
    for ping in ["{ form = [] }", "{ form = [\"\"] }"] {
        let err = rules(&format!("{base}ping = {ping}\n")).unwrap_err();
        assert!(err.contains("ping.form names no field"), "{ping}: {err}");
    }
    assert!(rules(&format!("{base}ping = {{ when = \"x\" }}\n")).unwrap_err().contains("unknown field"));

    let s = scheme(builtin("woocommerce"), &["k"], None);
    let answered = |h: &[(&str, &str)], body: &str| s.ping(&delivery(&headers(h), body.as_bytes()));
    let ping = answered(&[("content-type", "application/x-www-form-urlencoded")], "webhook_id=12").unwrap();
    assert_eq!((ping.content_type, ping.body.as_str()), ("application/json", r#"{"status":"ping"}"#));
    for (h, body, why) in [
        (&[("x-wc-webhook-signature", "bm9wZQ==")][..], "webhook_id=12", "a signature, even a wrong one: verified"),
        (&[("X-WC-Webhook-Signature", "")][..], "webhook_id=12", "an empty signature header is still one"),
        (&[], "webhook_id=", "an empty value"),
        (&[], "webhook_id=12&webhook_id=13", "a field twice"),
        (&[], "webhook_id=12&order=1", "a field more"),
        (&[], "", "no field"),
        (&[], r#"{"webhook_id":12}"#, "not a form"),
        (&[], &*format!("webhook_id={}", "1".repeat(2000)), "over a kilobyte"),
    ] {
        assert!(answered(h, body).is_none(), "{why}: {body:.40}");
    }
    assert!(
        scheme(builtin("typeform"), &["k"], None).ping(&delivery(&headers(&[]), b"webhook_id=12")).is_none(),
        "no ping declared: no ping"
    );
}

#[test]
fn an_ecdsa_contract_verifies_with_the_providers_public_key() {
    use p256::ecdsa::{signature::Signer, Signature, SigningKey};
    // A public key as SendGrid shows it: base64 of the DER SubjectPublicKeyInfo (a fixed prefix, then the point).
    let der = |k: &SigningKey| {
        let prefix = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
        B64.encode([prefix, k.verifying_key().to_encoded_point(false).as_bytes().to_vec()].concat())
    };
    let r = builtin("sendgrid");
    let signing = SigningKey::from_slice(&[7u8; 32]).unwrap();
    let public = der(&signing);
    let other = der(&SigningKey::from_slice(&[9u8; 32]).unwrap());
    let keys = [r.decode_secret(&other).unwrap(), r.decode_secret(&public).unwrap()];
    let s = Declared::new(Provider::try_from("sendgrid").unwrap(), r.clone(), keys.to_vec(), None);
    let body = br#"[{"sg_event_id":"sg1","event":"delivered"},{"sg_event_id":"sg2","event":"open"}]"#;
    let t = now().to_string();
    let sig: Signature = signing.sign(&[t.as_bytes(), body].concat());
    let high_s = Signature::from_scalars(sig.r(), -*sig.s()).unwrap();
    for (what, sig, sent, ok) in [
        ("signed", sig, &body[..], true),
        ("the same signature with a high S", high_s, &body[..], true),
        ("another body", sig, &br#"[{"sg_event_id":"sg1","event":"bounce"}]"#[..], false),
    ] {
        let value = B64.encode(sig.to_der().as_bytes());
        let h = headers(&[
            ("x-twilio-email-event-webhook-signature", &value),
            ("x-twilio-email-event-webhook-timestamp", &t),
        ]);
        let result = s.verify(&delivery(&h, sent));
        assert_eq!(result.clone().ok(), ok.then_some(Verified { secret_index: 1 }), "{what}: {result:?}");
    }
    // The timestamp is signed, and its age is checked: a captured delivery of
    // 2023 does not verify, nor one whose digits moved between the header and
    // the body (signed is timestamp + body, with no separator).
    let old = "1700000000";
    let moved = format!("{}{}", &t[..t.len() - 1], "");
    let moved_body = [&t.as_bytes()[t.len() - 1..], &body[..]].concat();
    for (what, ts, sent) in
        [("a 2023 timestamp", old, body.to_vec()), ("a digit moved into the body", moved.as_str(), moved_body)]
    {
        let signed: Signature = signing.sign(&[ts.as_bytes(), &sent].concat());
        let h = headers(&[
            ("x-twilio-email-event-webhook-signature", &B64.encode(signed.to_der().as_bytes())),
            ("x-twilio-email-event-webhook-timestamp", ts),
        ]);
        let refused = s.verify(&delivery(&h, &sent)).unwrap_err();
        assert_eq!(refused.kind(), RejectionKind::Stale, "{what}: {refused}");
    }
    let Events::Batch(events) = s.events(&delivery(&headers(&[]), body)) else { panic!("a batch") };
    assert_eq!((events[1].event_id.as_str(), events[1].event_type.as_str()), ("sg2", "open"));
    assert!(r.sign(b"k", &delivery(&headers(&[]), body), None, Some(&t)).is_err(), "only the provider signs");
    let pem = format!("-----BEGIN PUBLIC KEY-----\n{}\n{}\n-----END PUBLIC KEY-----\n", &public[..64], &public[64..]);
    assert!(r.decode_secret(&pem).is_ok(), "PEM works too");
    assert_eq!(r.decode_secret("c2VjcmV0").unwrap_err(), "is not a P-256 public key (base64 DER, or PEM)");
}

#[test]
fn thousands_of_signatures_cost_no_more_than_sixteen() {
    let r = builtin("calendly");
    let s = scheme(r.clone(), &["k"], None);
    let body = br#"{"event":"invitee.created","payload":{"uri":"u"}}"#;
    let t = now().to_string();
    let valid = r.sign(b"k", &delivery(&headers(&[]), body), None, Some(&t)).unwrap();
    let v1 = valid.rsplit_once("v1=").unwrap().1;
    let bogus = vec!["v1=00"; 10_000].join(",");
    let first = format!("t={t},v1={v1},{bogus}");
    assert!(s.verify(&delivery(&headers(&[("calendly-webhook-signature", &first)]), body)).is_ok());
    let last = format!("t={t},{bogus},v1={v1}");
    let refused = s.verify(&delivery(&headers(&[("calendly-webhook-signature", &last)]), body));
    assert!(refused.is_err(), "past the first {MAX_SIGNATURES}, signatures are not tried");
    // The bound is on all the candidates together, not per header value: 16
    // header values of 16 items each would otherwise be 256 tries.
    let bogus_16 = format!("t={t},{}", vec!["v1=00"; 16].join(","));
    let bogus_15 = format!("t={t},{}", vec!["v1=00"; 15].join(","));
    for (first, ok) in [(&bogus_15, true), (&bogus_16, false)] {
        let h = headers(&[("calendly-webhook-signature", first), ("calendly-webhook-signature", &valid)]);
        assert_eq!(s.verify(&delivery(&h, body)).is_ok(), ok, "the valid one after {first}");
    }
    // Thousands of header values: the same bound.
    let mut many: Vec<(&str, &str)> = vec![("x-cc-webhook-signature", "00"); 5_000];
    let sig = builtin("coinbase").sign(b"k", &delivery(&headers(&[]), body), None, None).unwrap();
    many.push(("x-cc-webhook-signature", &sig));
    assert!(scheme(builtin("coinbase"), &["k"], None).verify(&delivery(&headers(&many), body)).is_err());
    assert!(scheme(builtin("coinbase"), &["k"], None).verify(&delivery(&headers(&[many[5_000]]), body)).is_ok());
}
