//! What every function runs on: the Lambda deadline, the one shape of a batch
//! stage and its loops, metrics (EMF) and the tracing set-up.

pub(crate) mod deadline;
pub(crate) mod metrics;
pub(crate) mod scan;
pub(crate) mod stage;
pub(crate) mod telemetry;
pub(crate) mod trace;
