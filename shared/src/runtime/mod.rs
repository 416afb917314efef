//! What every function runs on: the Lambda deadline, the one shape of a batch
//! stage and its loops, metrics (EMF) and the tracing set-up.

pub mod deadline;
pub mod metrics;
pub mod stage;
pub mod telemetry;

/// Completes at Ctrl-C or SIGTERM: when a long-running server (`inbox dev`, `inbox console`) stops.
#[cfg(feature = "console")]
pub(crate) async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
