//! `inbox demo` as a new user runs it after cloning: no database, no secrets.
//! It must start its own stack, fire its storm and find every invariant true.

use std::process::Command;

#[test]
fn the_demo_runs_the_whole_pipeline_and_every_invariant_holds() {
    let out = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["demo", "--payments", "60"])
        .env_clear()
        .envs([("PATH", std::env::var("PATH").unwrap_or_default()), ("RUST_LOG", "warn".into())])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{stderr}");
    for line in [
        "inbox rows = unique signed events",
        "forged deliveries: 16 refused with 401, 0 stored",
        "payments = unique PaymentIntents: 60 payments, 60 expected",
        "the poison event is failed with its reason",
        "orders = their newest snapshot",
        "balances = sum of unique deposits",
        "one outbox message per effect",
        "every message delivered and applied once per key",
        "every invariant holds",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("FAIL") && !stdout.contains("unexpected"), "{stdout}");
}
