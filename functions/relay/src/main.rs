//! Lambda `relay`: [`webhook_inbox::lambda::relay`], for any application
//! without sinks of its own (a team with its own builds this from its `App`).

#[tokio::main]
async fn main() -> Result<(), webhook_inbox::lambda::Error> {
    webhook_inbox::lambda::relay(webhook_inbox::App::default()).await
}
