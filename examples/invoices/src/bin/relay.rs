//! Lambda `relay`: the outbox to its destinations, with this team's own sinks.

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::relay(invoices::app()?).await
}
