//! OpenTelemetry traces, for `inbox serve` with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`): one trace per delivery, its
//! `receive` span the root, the `process` span of its event a child, and the
//! `relay` span of each outbox message the handler wrote a child of that;
//! the relay's HTTP sink sends the relay span's `traceparent` on, so the
//! consumer's spans join the trace too.
//!
//! A delivery's trace crosses transactions and processes, so its context is
//! stored: the W3C `traceparent` of its receive span in
//! `webhook_inbox.trace_context`, and of the processing in
//! `transactional_outbox.trace_context`. Without an endpoint (and in the Lambda
//! functions, which are built without the `otlp` feature) nothing is made and
//! both columns stay NULL.

/// Which side of an exchange a span is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    /// Receive: a provider's request.
    Server,
    /// Processing: what a queue handed over.
    Consumer,
    /// The relay: a message sent on.
    #[cfg_attr(not(feature = "relay"), allow(dead_code))]
    Producer,
}

#[cfg(feature = "otlp")]
mod otel {
    use std::{
        sync::{
            atomic::{AtomicBool, Ordering},
            OnceLock,
        },
        time::Duration,
    };

    use opentelemetry::{
        trace::{
            Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
            Tracer as _, TracerProvider as _,
        },
        Context, KeyValue,
    };
    use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

    use super::Kind;

    static TRACER: OnceLock<(SdkTracerProvider, SdkTracer)> = OnceLock::new();
    static ON: AtomicBool = AtomicBool::new(false);

    /// Traces are exported.
    pub(crate) fn enabled() -> bool {
        ON.load(Ordering::Relaxed)
    }

    /// A span; ended when dropped.
    pub(crate) struct Span(opentelemetry_sdk::trace::Span);

    impl Span {
        /// Its W3C `traceparent`: what a child elsewhere (a later transaction, another process) starts from.
        pub(crate) fn traceparent(&self) -> String {
            let c = self.0.span_context();
            format!("00-{}-{}-{:02x}", c.trace_id(), c.span_id(), c.trace_flags().to_u8())
        }

        /// An attribute, as text.
        pub(crate) fn set(&mut self, key: &'static str, value: impl Into<String>) {
            self.0.set_attribute(KeyValue::new(key, value.into()));
        }

        /// The span's work failed, for this reason.
        pub(crate) fn fail(&mut self, reason: impl Into<String>) {
            self.0.set_status(Status::error(reason.into()));
        }
    }

    /// A span named `name`, the child of `parent` (a stored `traceparent`) when
    /// there is one, else the root of a new trace; `None` when traces are off.
    pub(crate) fn start(name: &'static str, kind: Kind, parent: Option<&str>) -> Option<Span> {
        if !enabled() {
            return None;
        }
        let (_, tracer) = TRACER.get()?;
        let cx = match parent.and_then(parse) {
            Some(remote) => Context::new().with_remote_span_context(remote),
            None => Context::new(),
        };
        let kind = match kind {
            Kind::Server => SpanKind::Server,
            Kind::Consumer => SpanKind::Consumer,
            Kind::Producer => SpanKind::Producer,
        };
        Some(Span(tracer.span_builder(name).with_kind(kind).start_with_context(tracer, &cx)))
    }

    /// `00-<32 hex>-<16 hex>-<2 hex>`; anything else is no parent.
    fn parse(traceparent: &str) -> Option<SpanContext> {
        let mut parts = traceparent.trim().split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if version != "00" || parts.next().is_some() || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return None;
        }
        let trace = TraceId::from_hex(trace).ok().filter(|t| *t != TraceId::INVALID)?;
        let span = SpanId::from_hex(span).ok().filter(|s| *s != SpanId::INVALID)?;
        let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
        Some(SpanContext::new(trace, span, flags, true, TraceState::default()))
    }

    /// Starts exporting to `endpoint` over OTLP/HTTP (protobuf), in batches
    /// (`OTEL_BSP_*` as the SDK reads them), from the current Tokio runtime.
    pub fn install(endpoint: &str, service: &str) -> anyhow::Result<()> {
        use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
        let client = Exporting {
            client: crate::core::http::http_client(Duration::from_secs(10))?,
            runtime: tokio::runtime::Handle::current(),
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint)
            .build()?;
        let resource = opentelemetry_sdk::Resource::builder().with_service_name(service.to_string()).build();
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        let tracer = provider.tracer("webhook-inbox");
        if TRACER.set((provider, tracer)).is_ok() {
            ON.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Exports what is still buffered, then stops: at the end of a drain.
    pub fn shutdown() {
        if let Some((provider, _)) = TRACER.get() {
            ON.store(false, Ordering::Relaxed);
            if let Err(e) = provider.shutdown() {
                tracing::warn!(error = %e, "exporting the last spans");
            }
        }
    }

    /// The exporter's HTTP client: the crate's own (rustls), its requests run
    /// on the service's runtime (the SDK exports from a thread of its own).
    #[derive(Debug)]
    struct Exporting {
        client: reqwest::Client,
        runtime: tokio::runtime::Handle,
    }

    /// The most of a collector's answer read.
    const OTLP_ANSWER_BYTES: usize = 64 * 1024;

    #[async_trait::async_trait]
    impl opentelemetry_http::HttpClient for Exporting {
        async fn send_bytes(
            &self,
            request: http::Request<bytes::Bytes>,
        ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
            let request = reqwest::Request::try_from(request)?;
            let client = self.client.clone();
            let sent = self.runtime.spawn(async move {
                let response = client.execute(request).await?;
                let mut answer = http::Response::builder().status(response.status());
                for (name, value) in response.headers() {
                    answer = answer.header(name, value);
                }
                // A collector's answer is a status (and a partial success); a body without end is not read.
                let body = crate::core::http::head(response, OTLP_ANSWER_BYTES).await;
                Ok::<_, opentelemetry_http::HttpError>(answer.body(bytes::Bytes::from(body))?)
            });
            sent.await?
        }
    }
}

#[cfg(feature = "otlp")]
pub use otel::{install, shutdown};
#[cfg(feature = "otlp")]
pub(crate) use otel::{start, Span};

#[cfg(not(feature = "otlp"))]
mod off {
    use super::Kind;

    /// Never made without the `otlp` feature.
    pub(crate) enum Span {}

    impl Span {
        pub(crate) fn traceparent(&self) -> String {
            match *self {}
        }

        pub(crate) fn set(&mut self, _: &'static str, _: impl Into<String>) {
            match *self {}
        }

        pub(crate) fn fail(&mut self, _: impl Into<String>) {
            match *self {}
        }
    }

    pub(crate) fn start(_: &'static str, _: Kind, _: Option<&str>) -> Option<Span> {
        None
    }
}

#[cfg(not(feature = "otlp"))]
pub(crate) use off::{start, Span};
