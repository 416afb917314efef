//! Lambda `relay`: [`webhook_inbox::lambda::relay`], for any application.

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::relay().await
}
