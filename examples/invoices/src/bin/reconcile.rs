//! Lambda `reconcile`: the same for every application.

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::reconcile().await
}
