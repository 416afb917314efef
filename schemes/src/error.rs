//! The error of a setting that cannot be used.

/// Errors in the environment, reported at start-up and never containing a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A variable that is missing, or whose value cannot be used.
    #[error("{var}: {reason}")]
    Invalid {
        /// The variable's name.
        var: std::borrow::Cow<'static, str>,
        /// What is wrong with it (never its value when it holds a secret).
        reason: String,
    },
}
