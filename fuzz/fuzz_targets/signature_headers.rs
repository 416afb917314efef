//! Every provider's signature check, the coded ones and every built-in
//! declared one, on arbitrary headers and body: no panic, and nothing verifies
//! without the secret (the fuzzer does not know it).
#![no_main]

use std::sync::OnceLock;

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use webhook_inbox_schemes::{
    catalog::{Catalog, Kind},
    secret::{MarqetaAuth, Secret, Secrets},
    Delivery, Schemes,
};

/// The coded schemes' header names; the declared ones' are added from the catalog.
const CODED_NAMES: &[&str] = &[
    "stripe-signature",
    "x-shopify-hmac-sha256",
    "x-shopify-webhook-id",
    "x-hub-signature-256",
    "x-github-delivery",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "authorization",
    "x-marqeta-signature",
];

fn catalog() -> Catalog {
    Catalog::with_file(None, |p| Some(format!("https://fuzz.example/webhooks/{p}"))).unwrap()
}

fn secrets(catalog: &Catalog) -> Secrets {
    let one = |s: &str| vec![Secret::new(s)];
    let declared = catalog
        .entries()
        .filter(|e| !matches!(e.kind, Kind::Coded))
        .map(|e| (e.provider, one("declared-fuzz-secret-never-guessed")))
        .collect();
    Secrets {
        stripe: one("whsec_fuzz_secret_never_guessed"),
        shopify: one("shopify_fuzz_secret_never_guessed"),
        github: one("github_fuzz_secret_never_guessed"),
        standard: vec![Secret::new(&b"standard-fuzz-key-never-guessed"[..])],
        marqeta: Some(MarqetaAuth {
            username: Secret::new("fuzz_user"),
            passwords: vec![Secret::new("fuzz-password-never-guessed")],
            signing_secrets: one("marqeta_fuzz_secret_never_guessed"),
        }),
        declared,
    }
}

/// Every provider configured, and every header name any of them reads; the fuzzer picks names by a byte.
fn setup() -> &'static (Schemes, Vec<HeaderName>) {
    static SETUP: OnceLock<(Schemes, Vec<HeaderName>)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let catalog = catalog();
        let schemes = Schemes::new(&catalog, &secrets(&catalog));
        let mut names: Vec<HeaderName> = CODED_NAMES.iter().map(|n| HeaderName::from_static(n)).collect();
        for entry in catalog.entries() {
            let scheme = schemes.get(entry.provider).expect("every provider is configured");
            for name in scheme.kept_headers().iter() {
                let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        (schemes, names)
    })
}

/// `[name byte, value length, value bytes...]*` then the body.
fn delivery<'a>(data: &'a [u8], names: &[HeaderName]) -> (HeaderMap, &'a [u8], i64) {
    let mut headers = HeaderMap::new();
    let mut rest = data;
    while let [name, len, tail @ ..] = rest {
        let len = (*len as usize).min(tail.len());
        if *name == 0xff {
            rest = tail;
            break;
        }
        let (value, tail) = tail.split_at(len);
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(names[*name as usize % names.len()].clone(), value);
        }
        rest = tail;
    }
    (headers, rest, 1_796_000_000)
}

fuzz_target!(|data: &[u8]| {
    let (schemes, names) = setup();
    let (headers, body, now) = delivery(data, names);
    for entry in schemes.catalog().entries() {
        let scheme = schemes.get(entry.provider).expect("every provider is configured");
        let d = Delivery { headers: &headers, body, now };
        assert!(scheme.verify(&d).is_err(), "{} verified without the secret", entry.provider);
        let _ = scheme.events(&d);
        // Only a small form can be a ping (WooCommerce's), whatever else arrives.
        if scheme.ping(&d).is_some() {
            assert!(body.len() <= 1024, "{} answered a ping of {} bytes", entry.provider, body.len());
        }
    }
});
