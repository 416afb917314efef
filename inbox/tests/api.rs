//! The management API as a machine meets it: `inbox console` running, a token
//! made with `inbox console token add`, and schemathesis (from PyPI) driving
//! every operation of `/api/v1/openapi.json` with generated and hostile
//! inputs: no 5xx, every response documented and matching its schema, input
//! outside the schema refused with a 4xx, no operation served without the token.

use std::process::{Command, Stdio};

use inbox_tests::{lines_of, KillOnDrop};
use sqlx::{postgres::PgConnectOptions, PgPool};

fn url_of(opts: &PgConnectOptions) -> String {
    format!("postgres://postgres@{}:{}/{}", opts.get_host(), opts.get_port(), opts.get_database().unwrap())
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn schemathesis_finds_every_answer_documented_and_no_server_error(pool: PgPool) {
    let opts = pool.connect_options();
    let url = url_of(&opts);
    assert!(
        Command::new("schemathesis").arg("--version").output().is_ok_and(|o| o.status.success()),
        "schemathesis is missing: pip install schemathesis==4.32.5 (scripts/test does)"
    );
    // Something to list, show, replay and erase.
    sqlx::query(
        "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, raw_body, secret_index, processed_at,
                                    failure_reason)
         SELECT 'stripe', 'evt_' || i, 'charge.succeeded', jsonb_build_object('n', i), s, '{}', 0, now(),
                CASE WHEN s = 'failed' THEN 'boom' END
         FROM generate_series(1, 40) AS i, LATERAL (SELECT (ARRAY['done', 'failed', 'unhandled', 'pending'])[i % 4 + 1] AS s) AS st",
    )
    .execute(&pool)
    .await
    .unwrap();
    let add = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["console", "token", "add", "schemathesis", "--role", "operator"])
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&add.stdout).into_owned();
    assert!(add.status.success(), "{printed}{}", String::from_utf8_lossy(&add.stderr));
    let token = printed.split("its hash): ").nth(1).expect("the token is printed").trim().to_string();

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_inbox"))
        .args(["console", "--port", &port.to_string()])
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", "warn")
        .env("INBOX_API_RATE_PER_SECOND", "10000")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    let _console = KillOnDrop(child);
    let ready = lines.recv_timeout(std::time::Duration::from_secs(60)).expect("inbox console starts");
    assert!(ready.contains("ready"), "{ready}");

    // From a folder of its own: schemathesis keeps its caches in the current one.
    let work = std::env::temp_dir().join(format!("inbox-schemathesis-{port}"));
    std::fs::create_dir_all(&work).unwrap();
    let out = Command::new("schemathesis")
        .current_dir(&work)
        .env("HYPOTHESIS_STORAGE_DIRECTORY", work.join("hypothesis"))
        .args(["run", &format!("http://127.0.0.1:{port}/api/v1/openapi.json")])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        // Every check but one: a timestamp PostgreSQL cannot read (an offset past 15:59, a day 31 of
        // June) is within a string's schema and answered 400, as it should be.
        .args(["--checks", "all", "--exclude-checks", "positive_data_acceptance"])
        .args(["--phases", "examples,coverage,fuzzing", "--max-examples", "40", "--seed", "7"])
        .args(["--generation-database", "none", "--no-color"])
        .output()
        .unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&work);
    println!("{report}");
    assert!(out.status.success(), "schemathesis found failures:\n{report}");
    // It reached the operations, not only the door.
    let replayed: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_audit WHERE actor = 'api:schemathesis'")
        .fetch_one(&pool)
        .await
        .unwrap();
    println!("audited actions by the API: {replayed}");
}
