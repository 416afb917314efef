//! Marqeta deposits (`transactions` items of type `gpa.credit` in state
//! `COMPLETION`): a delta, applied once per transaction token through a ledger.

use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::{decimal, required};
use webhook_inbox::{BatchHandler, Event, HandlerError, Message, Outcome};

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

/// Records the deposits' tokens in the ledger and credits their accounts,
/// once per token, in two statements: the accounts locked in one order, then
/// the ledger, the balances and each new deposit's balance after it in one.
/// For each deposit, in order, the balance it left (`None`: its token was in
/// the ledger already, or earlier in `deposits`). An account that does not
/// exist yet is transient: the call's writes roll back, and the deposit is
/// retried until the account exists (the worker runs the others without it).
pub async fn credit_all(conn: &mut PgConnection, deposits: &[Deposit]) -> Result<Vec<Option<String>>, HandlerError> {
    if deposits.is_empty() {
        return Ok(Vec::new());
    }
    let column = |f: fn(&Deposit) -> &str| deposits.iter().map(f).collect::<Vec<_>>();
    // Concurrent batches wait for each other here instead of deadlocking in the UPDATE.
    webhook_inbox::query(
        "SELECT FROM accounts WHERE account_id = ANY($1) ORDER BY account_id COLLATE \"C\" FOR NO KEY UPDATE",
    )
    .bind(column(|d| &d.account_id))
    .execute(&mut *conn)
    .await?;
    let credited: Vec<(String, Option<String>)> = webhook_inbox::query_as(
        "WITH input AS (
             SELECT token, account_id, amount::numeric(14, 2) AS amount, event_id, n
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY
                  AS d (token, account_id, amount, event_id, n)
         ), new AS (
             INSERT INTO account_deposits (token, account_id, amount, event_id)
             SELECT token, account_id, amount, event_id FROM input ORDER BY n
             ON CONFLICT (token) DO NOTHING
             RETURNING token, event_id
         ), credited AS (
             SELECT input.* FROM input JOIN new USING (token, event_id)
         ), balances AS (
             UPDATE accounts a SET balance = a.balance + c.total, updated_at = now()
             FROM (SELECT account_id, sum(amount) AS total FROM credited GROUP BY account_id) c
             WHERE a.account_id = c.account_id
             RETURNING a.account_id, a.balance
         )
         SELECT c.token, (b.balance - coalesce(sum(c.amount) OVER later, 0))::numeric(14, 2)::text
         FROM credited c LEFT JOIN balances b USING (account_id)
         WINDOW later AS (PARTITION BY c.account_id ORDER BY c.n ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING)",
    )
    .bind(column(|d| &d.token))
    .bind(column(|d| &d.account_id))
    .bind(column(|d| &d.amount))
    .bind(column(|d| &d.event_id))
    .fetch_all(&mut *conn)
    .await?;
    let mut balances = std::collections::HashMap::with_capacity(credited.len());
    for (token, balance) in credited {
        let Some(balance) = balance else {
            let d = deposits.iter().find(|d| d.token == token).expect("a credited deposit is one of them");
            return Err(HandlerError::Transient(format!("account {} does not exist yet", d.account_id)));
        };
        balances.insert(token, balance);
    }
    // The first deposit of a token is the one credited.
    Ok(deposits.iter().map(|d| balances.remove(&d.token)).collect())
}

/// The balance message of a credited deposit: an account's arrive in the order
/// they were written.
pub fn balance_message<'a>(d: &'a Deposit, balance: &str) -> Message<'a> {
    Message::new(
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
    .ordered_by(&d.account_id)
}

/// The handler of Marqeta `transactions:gpa.credit` items: a batch's deposits
/// in three statements (locks, credits, messages).
pub struct DepositHandler;

impl BatchHandler for DepositHandler {
    type Payload = Value;

    async fn handle_batch(&self, conn: &mut PgConnection, events: &[Event]) -> Result<Vec<Outcome>, HandlerError> {
        let mut deposits = Vec::with_capacity(events.len());
        // Each event's deposit, by its place in `deposits`: none for an item that is not a completed credit.
        let mut of_event = Vec::with_capacity(events.len());
        for event in events {
            let deposit = Deposit::from_marqeta(&event.event_id, &event.payload)?;
            of_event.push(deposit.map(|d| {
                deposits.push(d);
                deposits.len() - 1
            }));
        }
        let balances = credit_all(conn, &deposits).await?;
        let credited = |i: &Option<usize>| i.and_then(|i| Some((&deposits[i], balances[i].as_deref()?)));
        let messages: Vec<_> = (events.iter().zip(&of_event))
            .filter_map(|(e, i)| credited(i).map(|(d, balance)| (e, balance_message(d, balance))))
            .collect();
        Event::enqueue_all(conn, &messages).await?;
        let outcome = |i| if credited(i).is_some() { Outcome::Applied } else { Outcome::NoEffect };
        Ok(of_event.iter().map(outcome).collect())
    }

    fn lock_key(&self, event: &Event) -> Option<String> {
        Some(format!("account:{}", event.payload["user_token"].as_str()?))
    }
}
