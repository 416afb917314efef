//! The error of a setting that cannot be used.

/// Errors in the environment, reported at start-up and never containing a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{var}: {reason}")]
    Invalid { var: std::borrow::Cow<'static, str>, reason: String },
}
