//! What every function runs on: the Lambda deadline, the one shape of a batch
//! stage and its loops, metrics (EMF) and the tracing set-up.

pub mod deadline;
pub mod metrics;
pub(crate) mod scan;
pub mod stage;
pub mod telemetry;
pub mod trace;
