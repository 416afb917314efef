//! Tracing set-up shared by every binary: JSON lines on Lambda, plain text locally.
//!
//! `RUST_LOG` filters (default `info`), but no filter a user can set prints a
//! secret, a signature or a body: the libraries that log raw invocation events,
//! requests or responses at debug or trace (the Lambda runtime logs every event
//! it receives, headers and body, at trace; HTTP clients and the AWS SDK log
//! wire data) are capped at `info`, whatever `RUST_LOG` says.

use tracing::Subscriber;
use tracing_subscriber::{
    filter::{FilterExt, LevelFilter, Targets},
    fmt,
    layer::{Filter, SubscriberExt},
    registry::LookupSpan,
    util::SubscriberInitExt,
    EnvFilter, Layer,
};

/// Target prefixes capped at `info`: the Lambda runtime and `lambda_http`, every
/// AWS crate (SDKs, smithy, SigV4, `aws_lambda_events`), and the HTTP and TLS stacks.
pub(crate) const CAPPED_TARGETS: &[&str] =
    &["lambda_", "aws_", "hyper", "h2", "reqwest", "rustls", "tower", "tokio_rustls"];

/// `RUST_LOG`'s directives (or `info`), with [`CAPPED_TARGETS`] held at `info`.
pub(crate) fn filter<S>(rust_log: Option<&str>) -> impl Filter<S> + Send + Sync + 'static
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let wanted = rust_log.and_then(|d| EnvFilter::try_new(d).ok()).unwrap_or_else(|| EnvFilter::new("info"));
    let caps = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_targets(CAPPED_TARGETS.iter().map(|t| (*t, LevelFilter::INFO)));
    wanted.and(caps)
}

/// Installs the subscriber: `rust_log` filters (default `info`, capped as above);
/// `json` lines on Lambda, plain text on stderr elsewhere. Read from the
/// environment by [`crate::config::init_logging`].
pub(crate) fn init(rust_log: Option<&str>, json: bool) {
    let layer = if json {
        fmt::layer().json().without_time().with_target(false).boxed()
    } else {
        // Colours only on a terminal: a log written to a file or a pipe stays plain text.
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        fmt::layer().with_writer(std::io::stderr).with_ansi(ansi).with_target(false).boxed()
    };
    let _ = tracing_subscriber::registry().with(layer.with_filter(filter(rust_log))).try_init();
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged_with(rust_log: &str) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let layer = fmt::layer().with_writer(move || writer.clone()).with_filter(filter(Some(rust_log)));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::trace!(target: "lambda_runtime::layers::api_response", body = "SECRET-EVENT", "raw JSON event received from Lambda");
            tracing::debug!(target: "aws_smithy_runtime::client::http", body = "SECRET-WIRE", "sending");
            tracing::trace!(target: "hyper_util::client", "SECRET-HYPER");
            tracing::info!(target: "lambda_runtime", "runtime started");
            tracing::trace!(target: "webhook_inbox::worker", "our own trace");
        });
        let text = out.0.lock().unwrap().clone();
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn no_rust_log_reveals_what_the_libraries_log_of_events_and_requests() {
        for rust_log in
            ["trace", "lambda_runtime=trace", "aws_smithy_runtime=trace,trace", "hyper_util=trace,info", "debug"]
        {
            let text = logged_with(rust_log);
            assert!(!text.contains("SECRET"), "RUST_LOG={rust_log}: {text}");
            assert!(text.contains("runtime started"), "RUST_LOG={rust_log}: info still passes");
        }
        assert!(logged_with("trace").contains("our own trace"), "our own targets still follow RUST_LOG");
        assert!(!logged_with("info").contains("our own trace"));
    }
}
