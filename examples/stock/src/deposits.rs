//! Marqeta deposits (`transactions` items of type `gpa.credit` in state
//! `COMPLETION`): a delta, applied once per transaction token through a ledger.

use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::{decimal, required};
use webhook_inbox::{Event, Handler, HandlerError, Message, Outcome};

/// The event type receive gives a `transactions` item of type `gpa.credit`.
pub const EVENT_TYPE: &str = "transactions:gpa.credit";

#[derive(Debug, Clone, PartialEq, Eq)]
/// A completed Marqeta credit to an account.
pub struct Deposit {
    /// Marqeta's transaction token: the ledger's key, so a deposit is applied once.
    pub token: String,
    /// The account credited (Marqeta's `user_token`).
    pub account_id: String,
    /// Decimal text.
    pub amount: String,
    /// The inbox event that carried it.
    pub event_id: String,
}

impl Deposit {
    /// `None` when the item is not a completed credit (pending authorizations, ...).
    pub fn from_marqeta(event_id: &str, item: &Value) -> Result<Option<Self>, HandlerError> {
        if item["type"] != "gpa.credit" || item["state"] != "COMPLETION" {
            return Ok(None);
        }
        let amount = decimal(&item["amount"], "amount")?;
        if amount.starts_with('-') || amount.bytes().all(|b| b == b'0' || b == b'.') {
            return Err(HandlerError::Permanent(format!("a deposit must be positive, not {amount}")));
        }
        Ok(Some(Deposit {
            token: required(&item["token"], "token")?,
            account_id: required(&item["user_token"], "user_token")?,
            amount,
            event_id: event_id.to_string(),
        }))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
/// What crediting a deposit did.
pub enum Credit {
    /// The new balance.
    Credited(String),
    /// Its token is in the ledger already: nothing changed.
    AlreadyCredited,
}

/// Records the token in the ledger and credits the account, once (the balance message written as `event`'s). An account that
/// does not exist yet is transient: the savepoint rolls the ledger row back too,
/// and the event is retried until the account exists.
pub async fn credit(conn: &mut PgConnection, event: &Event, d: &Deposit) -> Result<Credit, HandlerError> {
    let new: Option<(String,)> = webhook_inbox::query_as(
        "INSERT INTO account_deposits (token, account_id, amount, event_id)
         VALUES ($1, $2, $3::numeric, $4)
         ON CONFLICT (token) DO NOTHING
         RETURNING token",
    )
    .bind(&d.token)
    .bind(&d.account_id)
    .bind(&d.amount)
    .bind(&d.event_id)
    .fetch_optional(&mut *conn)
    .await?;
    if new.is_none() {
        return Ok(Credit::AlreadyCredited);
    }
    let balance: Option<String> = webhook_inbox::query_scalar(
        "UPDATE accounts SET balance = balance + $2::numeric, updated_at = now()
         WHERE account_id = $1
         RETURNING balance::text",
    )
    .bind(&d.account_id)
    .bind(&d.amount)
    .fetch_optional(&mut *conn)
    .await?;
    let balance =
        balance.ok_or_else(|| HandlerError::Transient(format!("account {} does not exist yet", d.account_id)))?;
    // An account's balances arrive in the order they were written.
    let message = Message::new(
        "account",
        &d.account_id,
        format!("balance_updated:{}", d.token),
        json!({
            "event": "balance_updated",
            "account_id": d.account_id,
            "deposit_amount": d.amount,
            "balance": balance,
            "token": d.token,
        }),
    )
    .ordered_by(&d.account_id);
    event.enqueue(conn, &message).await?;
    Ok(Credit::Credited(balance))
}

/// The handler of Marqeta `transactions:gpa.credit` items.
pub struct DepositHandler;

impl Handler for DepositHandler {
    type Payload = Value;

    async fn handle(&self, conn: &mut PgConnection, event: &Event) -> Result<Outcome, HandlerError> {
        match Deposit::from_marqeta(&event.event_id, &event.payload)? {
            None => Ok(Outcome::NoEffect),
            Some(deposit) => match credit(conn, event, &deposit).await? {
                Credit::Credited(_) => Ok(Outcome::Applied),
                Credit::AlreadyCredited => Ok(Outcome::NoEffect),
            },
        }
    }

    fn lock_key(&self, event: &Event) -> Option<String> {
        Some(format!("account:{}", event.payload["user_token"].as_str()?))
    }
}
