//! Lambda `receive` with the stock application: [`webhook_inbox::lambda::receive`].

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::receive(stock::app()).await
}
