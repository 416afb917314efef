//! What every function runs on: the Lambda deadline and the tracing set-up.

pub mod deadline;
pub mod telemetry;
