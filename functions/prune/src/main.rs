//! Lambda `prune`: [`webhook_inbox::lambda::prune`], for any application.

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::prune().await
}
