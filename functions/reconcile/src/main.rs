//! Lambda `reconcile`: [`webhook_inbox::lambda::reconcile`], for any application.

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::reconcile(stock::app()).await
}
