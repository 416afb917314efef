//! Leaf types and plumbing every stage shares: the configuration error, the providers, secrets, what a
//! usable payload is, backoff with `Retry-After`, ignore rules, and the outbound HTTP client.

#[cfg(feature = "service")]
pub(crate) mod aws;
#[cfg(feature = "service")]
pub(crate) mod backoff;
#[cfg(feature = "http-client")]
pub(crate) mod http;
#[cfg(feature = "service")]
pub(crate) mod rules;
#[cfg(feature = "service")]
pub(crate) mod selection;
#[cfg(feature = "service")]
pub(crate) mod status;
