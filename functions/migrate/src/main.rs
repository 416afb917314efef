//! Lambda `migrate` with the stock application: [`webhook_inbox::lambda::migrate`].

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::migrate(stock::app()).await
}
