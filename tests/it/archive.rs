//! Prune's archive (`INBOX_ARCHIVE_S3_BUCKET`) against moto's S3 and a real
//! PostgreSQL: each batch is stored, one gzip-compressed JSON Lines object per
//! provider and day, before its rows are deleted; a failed upload deletes
//! nothing and says so; `restore` puts the events back into a fresh database
//! exactly as they were (a batch's shared body once), duplicates skipped, and
//! `requeue` runs them through a handler registered after they were archived.

use std::{
    io::{Read, Write},
    ops::ControlFlow,
    time::{Duration, Instant},
};

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use http::StatusCode;
use inbox_tests::*;
use serde_json::{json, Value};
use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    PgConnection, PgPool,
};
use webhook_inbox::{
    archive::{self, Archive, Location, RestoreOptions},
    config::Catalog,
    ops::{self, Audit, Filter, Status},
    ArchiveConfig, Event, Handler, HandlerError, Handlers, Outcome, PruneConfig, Pruner, Stage, Worker,
};
use webhook_inbox_schemes::Provider;

const BUCKET: &str = "inbox-archive";

fn retention() -> PruneConfig {
    PruneConfig {
        catalog: Catalog::builtin(),
        default_days: 60,
        done_days: Default::default(),
        failed_days: 180,
        outbox_days: 7,
        batch_size: 1000,
        archive: None,
    }
}

fn config(bucket: &str) -> ArchiveConfig {
    ArchiveConfig { bucket: bucket.into(), prefix: "inbox/".into() }
}

async fn prune(pool: &PgPool, archive: Archive) -> webhook_inbox::Pruned {
    Pruner::new(pool.clone(), retention())
        .with_archive(archive)
        .run(Instant::now() + Duration::from_secs(60))
        .await
        .unwrap()
}

/// Every inbox row with every column but `restored_at` (and its raw bytes,
/// wherever they are kept), in key order.
async fn rows(pool: &PgPool) -> Vec<(String, Option<Vec<u8>>)> {
    sqlx::query_as(
        "SELECT (to_jsonb(w) - 'restored_at')::text, coalesce(w.raw_body, b.raw_body)
         FROM webhook_inbox AS w LEFT JOIN webhook_bodies AS b ON b.sha256 = w.body_sha256
         ORDER BY w.provider, w.event_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A fresh database on the same server, with the migrations applied.
async fn fresh_database(opts: &PgConnectOptions, name: &str) -> PgPool {
    let admin = PgPoolOptions::new().max_connections(1).connect_with(opts.clone()).await.unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).execute(&admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE \"{name}\"")).execute(&admin).await.unwrap();
    let pool = PgPoolOptions::new().max_connections(4).connect_with(opts.clone().database(name)).await.unwrap();
    MIGRATOR.run(&pool).await.unwrap();
    pool
}

async fn drop_database(opts: &PgConnectOptions, name: &str) {
    let admin = PgPoolOptions::new().max_connections(1).connect_with(opts.clone()).await.unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).execute(&admin).await.unwrap();
}

async fn s3(moto: &Moto) -> aws_sdk_s3::Client {
    archive::s3_client(&moto.aws().await)
}

async fn object_lines(s3: &aws_sdk_s3::Client, key: &str) -> Vec<Value> {
    let object = s3.get_object().bucket(BUCKET).key(key).send().await.unwrap();
    let bytes = object.body.collect().await.unwrap().into_bytes();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&bytes[..]).read_to_string(&mut text).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Records the charges it is given: a handler deployed after the archive.
struct NewHandler;

impl Handler for NewHandler {
    type Payload = Value;
    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        sqlx::query("CREATE TABLE IF NOT EXISTS handled (event_id TEXT PRIMARY KEY)").execute(&mut *conn).await?;
        sqlx::query("INSERT INTO handled VALUES ($1)").bind(&event.event_id).execute(&mut *conn).await?;
        Ok(Outcome::Applied)
    }
}

/// Restore's options: the built-in providers, the test's secrets, the operator `ops`.
fn options(dry_run: bool, unverified: bool) -> RestoreOptions {
    RestoreOptions { dry_run, catalog: Catalog::builtin(), secrets: secrets(false), unverified, actor: "ops".into() }
}

const BY: Audit<'static> = Audit { actor: "ops", action: "requeue", reason: "backfill the new handler" };

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn prune_archives_each_provider_and_day_before_deleting_and_restore_puts_them_back_as_they_were(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let moto = Moto::start();
    let s3 = s3(&moto).await;
    s3.create_bucket().bucket(BUCKET).send().await.unwrap();
    let app = TestApp::spawn(opts.clone(), secrets(false)).await;
    let pool = app.pool.clone();
    // An amount no f64 holds: the archive keeps jsonb's numbers exactly.
    for (id, amount) in [("evt_1", "1999"), ("evt_2", "123456789012345678901234567890.123456789"), ("evt_3", "5")] {
        let body = format!(
            r#"{{"id":"{id}","type":"charge.succeeded","data":{{"object":{{"amount":{amount},"note":"ünïcode \u0001"}}}}}}"#
        )
        .into_bytes();
        let signed = stripe_header(STRIPE[0], &body);
        assert_eq!(app.post("stripe", &[("Stripe-Signature", &signed)], &body).await.0, StatusCode::OK);
    }
    let batch = json!({"transactions": [
        {"token": "tx_a", "type": "gpa.credit", "state": "COMPLETION", "amount": "1.00"},
        {"token": "tx_b", "type": "gpa.credit", "state": "COMPLETION", "amount": "2.00"}]})
    .to_string();
    let auth = marqeta_basic(MARQETA_USER, MARQETA_PASSWORDS[0]);
    assert_eq!(app.post("marqeta", &[("Authorization", &auth)], batch.as_bytes()).await.0, StatusCode::OK);
    // No handler yet: every event is kept unhandled.
    let w = Worker::new(pool.clone(), Handlers::new(), fast_worker_config());
    while w.run_once(later()).await.unwrap().taken > 0 {}
    // A pending row and a recent one stay out of the archive.
    sqlx::query(
        "UPDATE webhook_inbox SET received_at = received_at - CASE WHEN event_id = 'evt_3' THEN interval '101 days'
                                                                  ELSE interval '100 days' END,
                                  processed_at = processed_at - interval '100 days'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let recent = br#"{"id":"evt_recent","type":"charge.succeeded","data":{"object":{}}}"#;
    let signed = stripe_header(STRIPE[0], recent);
    assert_eq!(app.post("stripe", &[("Stripe-Signature", &signed)], recent).await.0, StatusCode::OK);
    let before = rows(&pool).await;
    assert_eq!(before.len(), 6);

    let archive = Archive::new(&moto.aws().await, config(BUCKET));
    let pruned = prune(&pool, archive.clone()).await;
    assert_eq!((pruned.done, pruned.archived, pruned.archive_objects, pruned.not_archived), (5, 5, 3, 0), "{pruned:?}");
    let left: Vec<String> = sqlx::query_scalar("SELECT event_id FROM webhook_inbox").fetch_all(&pool).await.unwrap();
    assert_eq!(left, ["evt_recent"]);

    // One object per provider and day, named by both, counting its events.
    let objects = archive.list(None, None).await.unwrap();
    let mut seen: Vec<(String, Option<u64>)> = objects.iter().map(|o| (o.provider.clone(), o.events)).collect();
    seen.sort();
    assert_eq!(seen, [("marqeta".into(), Some(2)), ("stripe".into(), Some(1)), ("stripe".into(), Some(2))]);
    let stripe_days: Vec<&str> = objects.iter().filter(|o| o.provider == "stripe").map(|o| o.day.as_str()).collect();
    assert_ne!(stripe_days[0], stripe_days[1], "evt_3 was received the day before");
    assert!(objects.iter().all(|o| o.key.starts_with(&format!("inbox/{}/{}/", o.provider, o.day))));
    assert_eq!(archive.list(Some("stripe"), None).await.unwrap().len(), 2);
    assert_eq!(archive.list(Some("stripe"), Some(&stripe_days[0][..7])).await.unwrap().len(), 2, "a month's prefix");
    // Every column; the batch's shared body once, on the first line that points at it.
    let marqeta = objects.iter().find(|o| o.provider == "marqeta").unwrap();
    let lines = object_lines(&s3, &marqeta.key).await;
    assert_eq!(lines[0]["status"], "unhandled");
    assert!(lines[0]["raw_body"].is_string() && lines[1]["raw_body"].is_null(), "{lines:?}");
    assert_eq!(lines[0]["body_sha256"], lines[1]["body_sha256"]);
    for column in
        ["received_at", "processed_at", "headers", "payload", "secret_index", "secret_fingerprint", "attempts"]
    {
        assert!(lines[1].get(column).is_some(), "{column} missing from {:?}", lines[1]);
    }

    // Restore into a fresh database: exactly as they were, and marked restored.
    let fresh = fresh_database(&opts, "archive_restore_fresh").await;
    let source = Location::parse(&format!("s3://{BUCKET}/inbox/")).unwrap();
    let aws = moto.aws().await;
    // The rows were moved 100 days back, past their signed timestamps (and Marqeta's Basic
    // credentials are never stored): none verifies here, so they are taken as unverified, each
    // payload what its bytes say.
    let restored = archive::restore(&fresh, &source, Some(&aws), &options(false, false), |_| {}).await.unwrap();
    assert_eq!((restored.objects, restored.lines, restored.restored, restored.rejected), (3, 5, 0, 5), "{restored:?}");
    assert!(restored.reasons.iter().all(|r| r.contains("do not verify with the")), "{restored:?}");
    let unverified = archive::restore(&fresh, &source, Some(&aws), &options(false, true), |_| {}).await.unwrap();
    assert_eq!((unverified.restored, unverified.unverified, unverified.duplicates), (5, 5, 0), "{unverified:?}");
    assert_eq!(
        rows(&fresh).await,
        before.iter().filter(|(r, _)| !r.contains("evt_recent")).cloned().collect::<Vec<_>>()
    );
    assert_eq!(scalar::<i64>(&fresh, "SELECT count(*) FROM webhook_inbox WHERE restored_at IS NOT NULL").await, 5);
    let audited = "SELECT count(*) FROM inbox_audit WHERE action = 'restore' AND actor = 'ops' AND reason LIKE 'restored from s3://%'";
    assert_eq!(scalar::<i64>(&fresh, audited).await, 5, "each restored event audited, with its object");
    // Again: every key is stored already.
    let again = archive::restore(&fresh, &source, Some(&aws), &options(false, true), |_| {}).await.unwrap();
    assert_eq!((again.restored, again.duplicates), (0, 5));
    // Prune keeps a restored event its retention from the restore, not from when it was received.
    let pruned = Pruner::new(fresh.clone(), retention()).run(Instant::now() + Duration::from_secs(30)).await.unwrap();
    assert_eq!(pruned.done, 0);

    // A handler registered now runs over the restored events once they are requeued.
    let filter = Filter { statuses: vec![Status::Unhandled], provider: Some("stripe".into()), ..Filter::default() };
    assert_eq!(ops::requeue_all(&fresh, &filter, &BY, 100, |_| ControlFlow::Continue(())).await.unwrap().requeued, 3);
    let handlers = Handlers::new().on(Provider::STRIPE, "charge.succeeded", NewHandler).unwrap();
    let w = Worker::new(fresh.clone(), handlers, fast_worker_config());
    while w.run_once(later()).await.unwrap().taken > 0 {}
    let handled: Vec<String> =
        sqlx::query_scalar("SELECT event_id FROM handled ORDER BY event_id").fetch_all(&fresh).await.unwrap();
    assert_eq!(handled, ["evt_1", "evt_2", "evt_3"]);
    fresh.close().await;
    drop_database(&opts, "archive_restore_fresh").await;
}

#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn a_failed_upload_deletes_nothing_and_the_run_says_so(pool: PgPool) {
    let moto = Moto::start();
    let s3 = s3(&moto).await;
    for (id, status, days) in [("done-old", "done", 90), ("failed-old", "failed", 200), ("done-new", "done", 1)] {
        sqlx::query(
            "INSERT INTO webhook_inbox (provider, event_id, event_type, payload, status, received_at, processed_at,
                                        raw_body, secret_index, failure_reason)
             VALUES ('stripe', $1, 't', '{}', $2, now() - make_interval(days => $3), now(), '{}', 0,
                     CASE WHEN $2 = 'failed' THEN 'x' END)",
        )
        .bind(id)
        .bind(status)
        .bind(days)
        .execute(&pool)
        .await
        .unwrap();
    }
    // No such bucket: S3 refuses every object.
    let archive = Archive::new(&moto.aws().await, config(BUCKET));
    let pruned = prune(&pool, archive.clone()).await;
    assert_eq!((pruned.done, pruned.failed, pruned.archived, pruned.not_archived), (0, 0, 0, 2), "{pruned:?}");
    let error = pruned.archive_error.as_deref().unwrap();
    assert!(error.contains(&format!("s3://{BUCKET}/inbox/stripe/")) && error.contains("NoSuchBucket"), "{error}");
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM webhook_inbox").await, 3, "nothing deleted");

    // Once the bucket is there, the next run archives and deletes them.
    s3.create_bucket().bucket(BUCKET).send().await.unwrap();
    let pruned = prune(&pool, archive.clone()).await;
    assert_eq!((pruned.done, pruned.failed, pruned.archived, pruned.not_archived), (1, 1, 2, 0), "{pruned:?}");
    assert!(pruned.archive_error.is_none());
    let left: Vec<String> = sqlx::query_scalar("SELECT event_id FROM webhook_inbox").fetch_all(&pool).await.unwrap();
    assert_eq!(left, ["done-new"]);
}

/// An archive's line is a stranger's: whoever can write to the bucket (or
/// hands an operator a file) wrote it. Each hostile line is refused by its
/// number and why, the others restored: a payload that is not what its signed
/// bytes say, bytes no secret here verifies, a provider this inbox does not
/// know, a time that cannot be, a type its bytes do not give, a line of
/// 40 MiB; links and devices are never read.
#[sqlx::test(migrator = "inbox_tests::MIGRATOR")]
async fn restore_refuses_each_bad_line_by_number_and_restores_the_others(pool: PgPool) {
    let t = now() - 60;
    let good = |id: &str| {
        let body = json!({"id": id, "type": "charge.succeeded", "data": {"object": {"amount": 100}}}).to_string();
        let signature = format!("t={t},v1={}", stripe_v1(STRIPE[0], t, body.as_bytes()));
        json!({"v": 1, "provider": "stripe", "event_id": id, "event_type": "charge.succeeded", "status": "done",
               "source": "webhook", "received_at": rfc3339(t), "processed_at": rfc3339(t + 1),
               "next_attempt_at": null, "attempts": 1, "failure_reason": null,
               "payload": serde_json::from_str::<Value>(&body).unwrap(), "headers": {"stripe-signature": signature},
               "raw_body": B64.encode(&body), "body_sha256": null, "secret_index": 0, "secret_fingerprint": null,
               "trace_context": null, "erased_at": null, "erased_by": null, "restored_at": null})
    };
    let mut lines = vec![good("evt_good_1").to_string(), "{not json".into()];
    let with = |id: &str, key: &str, value: Value| {
        let mut line = good(id);
        line[key] = value;
        line
    };
    let mut forged_payload = good("evt_forged");
    forged_payload["payload"]["data"]["object"]["amount"] = json!(100_000);
    let mut bad_bytes = good("evt_bad_sig");
    let resigned = format!(
        "t={t},v1={}",
        stripe_v1("whsec_not_ours", t, &B64.decode(bad_bytes["raw_body"].as_str().unwrap()).unwrap())
    );
    bad_bytes["headers"]["stripe-signature"] = json!(resigned);
    let mut long = good("evt_long");
    long["failure_reason"] = json!("x".repeat(40 << 20));
    for bad in [
        with("evt_pending", "status", json!("pending")),
        with("evt_bad_bytes", "raw_body", json!("%%%")),
        with("evt_orphan", "body_sha256", json!("00".repeat(32))),
        with("evt_future", "v", json!(2)),
        with("x", "event_id", json!("x".repeat(100_000))),
        with("evt_bad_time", "received_at", json!("2025-13-45T00:00:00Z")),
        // What only PostgreSQL refuses: a failed row without its reason.
        with("evt_no_reason", "status", json!("failed")),
        forged_payload,
        with("evt_path", "provider", json!("stripe/2025-01-01/forged")),
        with("evt_2999", "received_at", json!("2999-01-01T00:00:00.000000Z")),
        with("evt_bidi", "event_type", json!("charge.succeeded\u{202e}")),
        bad_bytes,
        long,
    ] {
        lines.push(bad.to_string());
    }
    lines.push(good("evt_good_2").to_string());
    let dir = std::env::temp_dir().join(format!("inbox-restore-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("stripe.jsonl.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(lines.join("\n").as_bytes()).unwrap();
    std::fs::write(&file, gz.finish().unwrap()).unwrap();
    std::fs::write(dir.join("garbage.jsonl.gz"), [0x1f, 0x8b, 0, 1, 2, 3]).unwrap();
    // Two gzip members in one file (what `cat a.gz b.gz` makes): both are read.
    let mut multi = Vec::new();
    for id in ["evt_multi_1", "evt_multi_2"] {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(format!("{}\n", good(id)).as_bytes()).unwrap();
        multi.extend(gz.finish().unwrap());
    }
    std::fs::write(dir.join("multi.jsonl.gz"), multi).unwrap();
    // A link to a device without end, and a link to the folder itself: never followed.
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.jsonl.gz")).unwrap();
    std::os::unix::fs::symlink(&dir, dir.join("loop")).unwrap();

    let source = Location::Path(file.clone());
    let dry = archive::restore(&pool, &source, None, &options(true, false), |_| {}).await.unwrap();
    assert_eq!((dry.lines, dry.restored, dry.rejected), (16, 2, 14), "{dry:?}");
    assert_eq!(scalar::<i64>(&pool, "SELECT count(*) FROM webhook_inbox").await, 0, "a dry run changes nothing");
    let done = archive::restore(&pool, &source, None, &options(false, false), |_| {}).await.unwrap();
    assert_eq!((done.lines, done.restored, done.duplicates, done.rejected), (16, 2, 0, 14), "{done:?}");
    let reasons = done.reasons.join("\n");
    for expected in [
        "line 2: not an archived event",
        "line 3: pending",
        "line 4: raw_body is not base64",
        "line 5: its batch body",
        "line 6: format 2 is newer",
        "line 7: its event id is empty or too long",
        "line 8: received_at \"2025-13-45T00:00:00Z\" is not a time",
        "line 9: PostgreSQL refused it",
        "line 10: its payload is not what its raw bytes say",
        "line 11: \"stripe/2025-01-01/forged\" is not a provider this inbox knows",
        "line 12: received_at 2999-01-01T00:00:00.000000Z cannot be",
        "line 13: its raw bytes say its type is \"charge.succeeded\"",
        "line 14: its bytes do not verify with the stripe secrets configured here",
        "line 15: longer than 32 MiB",
    ] {
        assert!(reasons.contains(expected), "{expected:?} not in:\n{reasons}");
    }
    let ids: Vec<String> =
        sqlx::query_scalar("SELECT event_id FROM webhook_inbox ORDER BY 1").fetch_all(&pool).await.unwrap();
    assert_eq!(ids, ["evt_good_1", "evt_good_2"]);
    // A folder: each regular file in turn (links skipped); one that is not gzip-compressed JSON Lines is
    // refused, named, and the others go on.
    let folder =
        archive::restore(&pool, &Location::Path(dir.clone()), None, &options(false, false), |_| {}).await.unwrap();
    assert_eq!((folder.objects, folder.restored, folder.duplicates, folder.rejected), (3, 2, 2, 15), "{folder:?}");
    assert!(folder.reasons[0].contains("garbage.jsonl.gz line 1: not readable"), "{:?}", folder.reasons);
    let (link, nope, verified) =
        (Location::Path(dir.join("zero.jsonl.gz")), Location::Path(dir.join("nope")), options(false, false));
    let link = archive::restore(&pool, &link, None, &verified, |_| {}).await.unwrap_err();
    assert!(link.to_string().contains("a symbolic link"), "a link given is refused, not read: {link}");
    let missing = archive::restore(&pool, &nope, None, &verified, |_| {}).await.unwrap_err();
    assert!(missing.to_string().contains("nope"), "{missing}");
    // Taking unverified lines takes the one no secret here verifies; a forged payload stays refused.
    let taken = archive::restore(&pool, &source, None, &options(false, true), |_| {}).await.unwrap();
    assert_eq!((taken.restored, taken.unverified, taken.duplicates, taken.rejected), (1, 1, 2, 13), "{taken:?}");
    let audited = scalar::<i64>(&pool, "SELECT count(*) FROM inbox_audit WHERE action = 'restore' AND actor = 'ops'");
    assert_eq!(audited.await, 5);
    std::fs::remove_dir_all(&dir).unwrap();
}
