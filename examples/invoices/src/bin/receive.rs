//! Lambda `receive` with the team's handlers and migrations.

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::receive(invoices::app()?).await
}
