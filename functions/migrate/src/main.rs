//! Lambda `migrate` with the reference domain: [`webhook_inbox::lambda::migrate`].

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::migrate(webhook_inbox::reference::app()).await
}
