//! Lambda `process` with the team's handlers and migrations.

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::process(invoices::app()?).await
}
