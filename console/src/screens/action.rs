//! What every action shares: the confirmation page, the operator's check, the audit reason.

use askama::Template;

use crate::store::UserRole;
use crate::{
    auth::Signed,
    page::{optional, Nav, PageError},
};
use webhook_inbox::ops;

/// An action's audit reason as the form gave it (`default` when empty), or the page that says it is too long.
pub(super) fn audit_reason(text: &str, default: &str) -> Result<String, PageError> {
    let text = optional(text).unwrap_or_else(|| default.to_string());
    ops::audit_reason(&text).map_err(|why| PageError::BadRequest(format!("Nothing was done: {why}.")))
}

#[derive(Template)]
#[template(path = "console/confirm.html")]
pub(super) struct ConfirmPage {
    pub(super) nav: Nav,
    pub(super) title: String,
    /// What will happen, in sentences.
    pub(super) what: Vec<String>,
    /// The form's action, and its hidden fields (besides the CSRF token).
    pub(super) action: String,
    pub(super) fields: Vec<(&'static str, String)>,
    /// The audit's reason, prefilled; none for an action without one.
    pub(super) reason: Option<&'static str>,
    pub(super) button: String,
    pub(super) back: String,
    /// Why it cannot be done, instead of a form.
    pub(super) refused: Option<String>,
}

pub(super) fn operator_only(signed: &Signed) -> Result<(), PageError> {
    if signed.role != UserRole::Operator {
        return Err(PageError::Forbidden("Viewers cannot act: nothing was done. An operator can."));
    }
    Ok(())
}

/// Requeue and retry work in batches of this many rows, each its own short transaction.
pub(super) const BATCH: i64 = 500;

#[derive(Template)]
#[template(path = "console/progress.html")]
pub(super) struct ProgressPage {
    pub(super) nav: Nav,
    /// `Requeueing`, `Erasing`.
    pub(super) title: &'static str,
    pub(super) what: String,
    pub(super) back: String,
}

/// The page `page` with the lines `lines` sends streamed into it as they come
/// (a bulk action's batches: no script needed), then the page's end.
pub(super) fn streamed(
    page: ProgressPage,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
) -> Result<axum::response::Response, PageError> {
    use axum::response::IntoResponse as _;
    let page = page.render().map_err(|_| PageError::Internal)?;
    let (head, tail) =
        page.split_once("<!--progress-->").map(|(h, t)| (h.to_string(), t.to_string())).unwrap_or_default();
    let stream =
        futures_util::stream::unfold((Some(head), lines, Some(tail)), |(head, mut receiver, tail)| async move {
            if let Some(head) = head {
                return Some((head, (None, receiver, tail)));
            }
            match receiver.recv().await {
                Some(line) => Some((line, (None, receiver, tail))),
                None => tail.map(|t| (t, (None, receiver, None))),
            }
        });
    let body = axum::body::Body::from_stream(futures_util::StreamExt::map(stream, Ok::<_, std::convert::Infallible>));
    Ok(([(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response())
}
