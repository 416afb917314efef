//! Lambda `process` with the stock application: [`webhook_inbox::lambda::process`].

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::process(stock::app()).await
}
