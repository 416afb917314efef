//! Receive: each provider's signing scheme, the receive handler (receiver), the claim,
//! and inline mode. Only `providers` is built without the `service` feature.

pub mod providers;

#[cfg(feature = "service")]
pub mod claim;
#[cfg(feature = "service")]
pub mod notify;
#[cfg(feature = "service")]
pub mod receiver;
#[cfg(feature = "service")]
pub(crate) mod tally;
