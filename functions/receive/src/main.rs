//! Lambda `receive` with the reference domain: [`webhook_inbox::lambda::receive`].

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::receive(webhook_inbox::reference::app()).await
}
