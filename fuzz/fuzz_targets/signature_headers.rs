//! Every provider's signature check on arbitrary headers and body: no panic,
//! and nothing verifies without the secret (the fuzzer does not know it).
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use webhook_inbox::{
    core::secret::{MarqetaAuth, Secrets},
    ingest::providers::{Delivery, Provider, Schemes},
    Secret,
};

/// The header names the schemes read; the fuzzer picks among them by a byte.
const NAMES: &[&str] = &[
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

fn secrets() -> Secrets {
    let one = |s: &str| vec![Secret::new(s)];
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
    }
}

/// `[name byte, value length, value bytes...]*` then the body.
fn delivery(data: &[u8]) -> (HeaderMap, &[u8], i64) {
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
            headers.append(HeaderName::from_static(NAMES[*name as usize % NAMES.len()]), value);
        }
        rest = tail;
    }
    (headers, rest, 1_796_000_000)
}

fuzz_target!(|data: &[u8]| {
    let (headers, body, now) = delivery(data);
    let schemes = Schemes::new(&secrets());
    for provider in Provider::ALL {
        let scheme = schemes.get(provider).expect("every provider is configured");
        let d = Delivery { headers: &headers, body, now };
        assert!(scheme.verify(&d).is_err(), "{provider} verified without the secret");
        let _ = scheme.events(&d);
    }
});
