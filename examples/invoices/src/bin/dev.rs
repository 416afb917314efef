//! The whole stack locally with the team's handlers: `cargo run --bin invoices-dev --features dev`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let port = std::env::var("PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(9000);
    webhook_inbox_service::dev::run(invoices::app()?, "127.0.0.1", port).await
}
