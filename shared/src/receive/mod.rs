//! Receive: the receive handler (receiver) over the providers' schemes
//! (`webhook-inbox-schemes`), the claim, and inline mode.

#[cfg(feature = "service")]
pub(crate) mod claim;
#[cfg(feature = "service")]
pub(crate) mod notify;
#[cfg(feature = "service")]
pub(crate) mod receiver;
#[cfg(feature = "service")]
pub(crate) mod tally;
