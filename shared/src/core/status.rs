//! The status of an inbox row.

/// A row's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Waiting for the worker (due at `next_attempt_at`, if set).
    Pending,
    /// A handler applied it (with an effect or without).
    Done,
    /// Final, with its `failure_reason`.
    Failed,
    /// No handler takes its type: nothing ran. Kept like `done`, until a
    /// handler for it is deployed and the event requeued.
    Unhandled,
    /// An ignore rule (`INBOX_RULES_FILE`) matched it: nothing ran. Kept like
    /// `done`, and requeued like `unhandled`; `failure_reason` names the rule.
    Ignored,
}

impl Status {
    /// The name in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Done => "done",
            Status::Failed => "failed",
            Status::Unhandled => "unhandled",
            Status::Ignored => "ignored",
        }
    }

    /// The status of this name, if it is one.
    pub fn parse(name: &str) -> Option<Status> {
        [Status::Pending, Status::Done, Status::Failed, Status::Unhandled, Status::Ignored]
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
