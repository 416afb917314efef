//! Lambda `reconcile`: the providers' APIs the environment configures, and the team's own sources.

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::reconcile(invoices::app()?).await
}
