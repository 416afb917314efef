//! Whether an instance takes traffic (`/readyz`: the database reachable,
//! every migration applied, not draining), and the health routes.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use super::metrics;
use webhook_inbox::{query, App, Autocommit};

/// Whether the instance takes traffic: `/readyz`.
pub(super) struct Readiness {
    pub(super) draining: AtomicBool,
    /// Every migration was seen applied (they are never undone, so this stays).
    pub(super) migrated: AtomicBool,
    pub(super) pool: sqlx::PgPool,
    pub(super) app: App,
    /// The last answer, so that the log says each change once, not each probe.
    last: std::sync::Mutex<Option<String>>,
}

impl Readiness {
    pub(super) fn new(pool: sqlx::PgPool, app: App) -> Self {
        Readiness {
            draining: AtomicBool::new(false),
            migrated: AtomicBool::new(false),
            pool,
            app,
            last: std::sync::Mutex::new(None),
        }
    }

    /// `None` when ready, else why not; a change is logged.
    async fn check(&self) -> Option<String> {
        let now = self.reason().await;
        let mut last = self.last.lock().expect("the readiness lock");
        if *last != now {
            match &now {
                Some(reason) => tracing::warn!(reason = %reason, "not ready"),
                None => tracing::info!("ready"),
            }
            last.clone_from(&now);
        }
        now
    }

    async fn reason(&self) -> Option<String> {
        if self.draining.load(Ordering::SeqCst) {
            return Some("draining: the instance is shutting down".into());
        }
        let reachable = query("SELECT 1").execute(Autocommit(&self.pool));
        match tokio::time::timeout(Duration::from_secs(2), reachable).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Some(format!(
                    "the database is unreachable: {}",
                    webhook_inbox_schemes::text::escape(&e.to_string())
                ))
            }
            Err(_) => return Some("the database did not answer within 2 s".into()),
        }
        if self.migrated.load(Ordering::SeqCst) {
            return None;
        }
        match self.app.pending_migrations(&self.pool).await {
            Ok(pending) if pending.is_empty() => {
                self.migrated.store(true, Ordering::SeqCst);
                None
            }
            Ok(pending) => {
                Some(format!("migrations not applied (inbox serve --migrate applies them): {}", pending.join(", ")))
            }
            Err(e) => {
                Some(format!("reading the migrations applied: {}", webhook_inbox_schemes::text::escape(&e.to_string())))
            }
        }
    }
}

/// `/healthz`, `/readyz`, `/metrics` when `with_metrics`, and, on the admin port
/// only (`admin`), why `/readyz` is not ready: the database's words name roles
/// and hosts, not for strangers (the log has them too).
pub(super) fn health_router(readiness: Arc<Readiness>, with_metrics: bool, admin: bool) -> axum::Router {
    use axum::{
        http::{header::CONTENT_TYPE, StatusCode},
        response::IntoResponse,
        routing::get,
    };
    let json = |status: StatusCode, body: serde_json::Value| {
        (status, [(CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    };
    let ready = move || {
        let readiness = readiness.clone();
        async move {
            match readiness.check().await {
                None => json(StatusCode::OK, serde_json::json!({"status": "ready"})),
                Some(reason) if admin => {
                    json(StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({"status": "not ready", "reason": reason}))
                }
                Some(_) => json(StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({"status": "not ready"})),
            }
        }
    };
    let mut router = axum::Router::new()
        .route("/healthz", get(move || async move { json(StatusCode::OK, serde_json::json!({"status": "alive"})) }))
        .route("/readyz", get(ready));
    if with_metrics {
        router = router.route(
            "/metrics",
            get(|| async {
                ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics::render())
            }),
        );
    }
    router
}
