//! CloudWatch's embedded metric format (EMF): a line the functions write,
//! compared with what AWS's own `aws-embedded-metrics` library writes for the
//! same dimensions and values (so the format is CloudWatch's, not our reading
//! of it).

use std::{
    io::Write,
    process::{Command, Stdio},
};

use serde_json::{json, Value};

/// The line AWS's library writes for `ours`' dimensions and metrics.
pub fn reference(ours: &Value) -> Value {
    let aws = &ours["_aws"]["CloudWatchMetrics"][0];
    let dims: serde_json::Map<String, Value> = aws["Dimensions"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d.as_str().unwrap().into(), ours[d.as_str().unwrap()].clone()))
        .collect();
    let metrics: Vec<Value> = aws["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| json!([m["Name"], ours[m["Name"].as_str().unwrap()], m["Unit"]]))
        .collect();
    let spec = json!({"namespace": aws["Namespace"], "dimensions": dims, "metrics": metrics});
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/support/emf_reference.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(spec.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "aws-embedded-metrics is not installed (`pip install aws-embedded-metrics`; scripts/test does): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the library prints one JSON line")
}

/// Order-free (a dimension set is a set to CloudWatch), number-type-free, without the timestamp.
pub fn normalized(mut doc: Value) -> Value {
    let aws = doc["_aws"].as_object_mut().unwrap();
    let stamp = aws.remove("Timestamp").expect("a Timestamp");
    assert!(stamp.as_u64().is_some_and(|t| t > 1_700_000_000_000), "milliseconds since the epoch: {stamp}");
    let directive = &mut aws.get_mut("CloudWatchMetrics").unwrap()[0];
    for set in directive["Dimensions"].as_array_mut().unwrap() {
        set.as_array_mut().unwrap().sort_by_key(|d| d.as_str().unwrap().to_string());
    }
    let mut metrics = directive["Metrics"].as_array().unwrap().clone();
    metrics.sort_by_key(|m| m["Name"].as_str().unwrap().to_string());
    directive["Metrics"] = Value::Array(metrics);
    for (_, v) in doc.as_object_mut().unwrap().iter_mut() {
        if let Some(n) = v.as_f64() {
            *v = json!(n);
        }
    }
    doc
}

/// Asserts that `line` is what AWS's library writes for its dimensions and values.
pub fn assert_as_aws_writes_it(line: &Value) {
    assert_eq!(normalized(line.clone()), normalized(reference(line)), "our line:\n{line}");
}

/// The EMF lines among a function's output (`_aws` documents; its logs are the other lines).
pub fn lines(output: &str) -> Vec<Value> {
    output
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|doc| doc.get("_aws").is_some())
        .collect()
}
