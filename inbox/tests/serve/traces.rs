//! Traces: each delivery one trace from receive through processing to the
//! relay, exported over OTLP to a receiver in the test.

use std::{sync::mpsc, time::Duration};

use inbox_tests::{http_exchange, stripe_v1};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::{migrated, url_of, Serve, SECRET};

/// A span as the in-test OTLP receiver got it: name, kind, trace, span and parent (hex).
#[derive(Debug, Clone)]
struct Received {
    name: String,
    kind: i32,
    trace: String,
    span: String,
    parent: String,
    attributes: Vec<(String, String)>,
}

/// An OTLP/HTTP receiver (`POST /v1/traces`, protobuf), as a collector is: every span it is sent.
fn otlp_receiver() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Received>>>) {
    use opentelemetry_proto::tonic::{
        collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse},
        common::v1::any_value::Value,
    };
    use prost::Message as _;
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let got = spans.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let got = got.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                loop {
                    let (mut length, mut path) = (0usize, String::new());
                    let mut line = String::new();
                    if reader.read_line(&mut line).map(|n| n == 0).unwrap_or(true) {
                        return;
                    }
                    path.push_str(line.split_whitespace().nth(1).unwrap_or_default());
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).map(|n| n == 0).unwrap_or(true) {
                            return;
                        }
                        let l = line.trim_end().to_ascii_lowercase();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    assert_eq!(path, "/v1/traces");
                    let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
                    for span in request.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans) {
                        let attributes = span
                            .attributes
                            .iter()
                            .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
                                Value::StringValue(v) => Some((kv.key.clone(), v.clone())),
                                _ => None,
                            })
                            .collect();
                        got.lock().unwrap().push(Received {
                            name: span.name.clone(),
                            kind: span.kind,
                            trace: hex::encode(&span.trace_id),
                            span: hex::encode(&span.span_id),
                            parent: hex::encode(&span.parent_span_id),
                            attributes,
                        });
                    }
                    let answer = ExportTraceServiceResponse::default().encode_to_vec();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n\r\n",
                        answer.len()
                    );
                    if stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&answer)).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, spans)
}

/// A sink that answers 200 and hands over each request's `traceparent`.
pub(super) fn traced_sink() -> (String, mpsc::Receiver<Option<String>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/outbox", listener.local_addr().unwrap());
    let (tx, got) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                loop {
                    let (mut length, mut traceparent) = (0usize, None);
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).map(|n| n == 0).unwrap_or(true) {
                            return;
                        }
                        let l = line.trim_end().to_ascii_lowercase();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if let Some(v) = l.strip_prefix("traceparent:") {
                            traceparent = Some(v.trim().to_string());
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let _ = tx.send(traceparent);
                    if stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, got)
}

/// With an OTLP endpoint, each delivery is one trace: its receive span the
/// root, the processing of its event a child of it (across the transaction
/// and the worker), the relay of the message its handler wrote a child of
/// that, and the sink given the relay span as its `traceparent`.
#[sqlx::test(migrations = false)]
async fn each_delivery_is_one_trace_from_receive_through_processing_to_the_relay(
    pool: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let pool = migrated(pool, &opts).await;
    let (collector, spans) = otlp_receiver();
    let (sink, sunk) = traced_sink();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str()),
        ("OTEL_SERVICE_NAME", "inbox-under-test"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("RELAY_HTTP_URL", sink.as_str()),
        ("INBOX_POLL_MS", "20"),
    ];
    // The stock application: its payment handler writes the message the relay sends.
    let mut serve = Serve::start(&url_of(&opts), &["--stock"], &env);
    let body = r#"{"id":"evt_traced","type":"payment_intent.succeeded","data":{"object":{"id":"pi_traced","amount_received":1200,"currency":"eur"}}}"#;
    let t = inbox_tests::now();
    let sig = stripe_v1(SECRET, t, body.as_bytes());
    let post = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nStripe-Signature: t={t},v1={sig}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(http_exchange(&serve.main, &post).0, 200);
    let traceparent = sunk.recv_timeout(Duration::from_secs(10)).expect("the payment's message reaches the sink");
    let traceparent = traceparent.expect("the sink is given a traceparent");
    serve.sigterm();
    serve.line("drained in", Duration::from_secs(10));
    assert!(serve.child.0.wait().unwrap().success());

    let spans = spans.lock().unwrap().clone();
    let one = |name: &str| {
        let found: Vec<&Received> = spans.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} span: {spans:#?}");
        found[0].clone()
    };
    let (receive, process, relay) = (one("receive"), one("process"), one("relay"));
    // Kinds as OTLP numbers them: server 2, producer 4, consumer 5.
    assert_eq!((receive.kind, process.kind, relay.kind), (2, 5, 4));
    assert!(receive.parent.is_empty(), "receive is the trace's root: {receive:?}");
    assert_eq!((process.trace.as_str(), process.parent.as_str()), (receive.trace.as_str(), receive.span.as_str()));
    assert_eq!((relay.trace.as_str(), relay.parent.as_str()), (receive.trace.as_str(), process.span.as_str()));
    assert_eq!(traceparent, format!("00-{}-{}-01", relay.trace, relay.span));
    assert!(process.attributes.contains(&("webhook.outcome".into(), "done".into())), "{process:?}");
    assert!(receive.attributes.contains(&("webhook.claim".into(), "new".into())), "{receive:?}");
    let stored: (String, String) = sqlx::query_as(
        "SELECT w.trace_context, o.trace_context FROM webhook_inbox w JOIN transactional_outbox o ON o.event_id = w.event_id
         WHERE w.event_id = 'evt_traced'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        stored,
        (format!("00-{}-{}-01", receive.trace, receive.span), format!("00-{}-{}-01", process.trace, process.span))
    );
}
