//! Tracing set-up shared by every binary: JSON lines on Lambda, plain text locally.

use tracing_subscriber::{fmt, EnvFilter};

/// `RUST_LOG` filters (default `info`). Nothing here ever logs a secret, a signature or a body.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_target(false);
    let _ = if std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_some() {
        builder.json().without_time().try_init()
    } else {
        builder.with_writer(std::io::stderr).try_init()
    };
}
