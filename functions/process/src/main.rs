//! Lambda `process` with the reference domain: [`webhook_inbox::lambda::process`].

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::process(webhook_inbox::reference::app()).await
}
