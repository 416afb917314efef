//! The AWS SDK's configuration, shared by the relay's sinks, receive's
//! process-queue notice and the Secrets Manager read at start-up: TLS by
//! rustls with ring, every call bounded.

use aws_smithy_http_client::tls;

/// The longest one SQS or EventBridge call may take, retries included.
pub(crate) const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The AWS configuration from the environment, TLS by rustls with ring, each
/// call bounded to 10 s, retries included;
/// `endpoint` overrides the service endpoint (tests point it at moto).
pub async fn config(endpoint: Option<&str>) -> aws_config::SdkConfig {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    let timeouts = aws_config::timeout::TimeoutConfig::builder().operation_timeout(CALL_TIMEOUT).build();
    let mut loader =
        aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http).timeout_config(timeouts);
    if let Some(endpoint) = endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    loader.load().await
}

/// [`config`] from the environment alone, loaded once per process: a cold start
/// that reads its secrets and then connects to SQS builds one HTTP client, not two.
pub(crate) async fn from_env() -> aws_config::SdkConfig {
    static CONFIG: tokio::sync::OnceCell<aws_config::SdkConfig> = tokio::sync::OnceCell::const_new();
    CONFIG.get_or_init(|| config(None)).await.clone()
}

/// Where prune archives what it deletes (`crate::archive`, with the `archive` feature): a bucket, and a prefix in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveConfig {
    /// `INBOX_ARCHIVE_S3_BUCKET`.
    pub bucket: String,
    /// `INBOX_ARCHIVE_S3_PREFIX` (`inbox/`): the objects' keys start with it.
    pub prefix: String,
}
