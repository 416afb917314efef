//! An event as a delivery turns into it: one row to claim in `webhook_inbox`.

/// How a stored event starts its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitialStatus {
    /// Usable: for the handlers.
    Pending,
    /// Validly signed but unusable: kept with its reason, never retried.
    Failed,
}

impl InitialStatus {
    /// Its `status` in `webhook_inbox`.
    pub fn as_str(self) -> &'static str {
        match self {
            InitialStatus::Pending => "pending",
            InitialStatus::Failed => "failed",
        }
    }
}

/// One row to claim in `webhook_inbox`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEvent {
    /// The provider's id of the event, which deduplicates it (`event_id`).
    pub event_id: String,
    /// Its type, which chooses the handler (`event_type`).
    pub event_type: String,
    /// JSON text valid for `jsonb`; `None` when the body cannot be `jsonb`.
    pub payload: Option<String>,
    /// How it starts.
    pub status: InitialStatus,
    /// Why it is `failed` from the start.
    pub failure_reason: Option<String>,
}

/// The longest usable event id.
pub const MAX_EVENT_ID_CHARS: usize = 255;
/// Event types are cut to this length.
pub const MAX_EVENT_TYPE_CHARS: usize = 128;

impl NewEvent {
    /// A usable event; `payload` must be JSON text that `jsonb` takes (see `NewEvent::from_json`).
    pub fn pending(event_id: String, event_type: &str, payload: String) -> Self {
        NewEvent {
            event_id,
            event_type: event_type_of(event_type),
            payload: Some(payload),
            status: InitialStatus::Pending,
            failure_reason: None,
        }
    }

    /// A validly signed event we cannot use: stored as `failed`, answered 200.
    pub fn unusable(event_id: String, event_type: &str, payload: Option<String>, reason: impl Into<String>) -> Self {
        NewEvent {
            event_id,
            event_type: event_type_of(event_type),
            payload,
            status: InitialStatus::Failed,
            failure_reason: Some(reason.into()),
        }
    }
}

/// An event type as stored: at most [`MAX_EVENT_TYPE_CHARS`] characters,
/// control characters (which PostgreSQL's `text` may refuse) replaced.
pub fn event_type_of(t: &str) -> String {
    t.chars().take(MAX_EVENT_TYPE_CHARS).map(|c| if c.is_control() { '?' } else { c }).collect()
}
