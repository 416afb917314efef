//! What an instance of the service does: its roles (`--roles`, `INBOX_ROLES`).

use std::collections::BTreeSet;

/// What one instance of the service does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// `POST /webhooks/{provider}`, with group commit.
    Receive,
    /// The worker: your handlers over pending events.
    Process,
    /// The outbox to its sinks (`RELAY_*`).
    Relay,
    /// Retention, hourly.
    Prune,
    /// What providers never delivered, every 15 minutes (`STRIPE_API_KEY`, ...).
    Reconcile,
    /// The operator's console, at `/console`.
    Console,
}

impl Role {
    /// Every role, in order.
    pub const ALL: [Role; 6] = [Role::Receive, Role::Process, Role::Relay, Role::Prune, Role::Reconcile, Role::Console];

    /// Its name in `--roles` and `INBOX_ROLES`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Receive => "receive",
            Role::Process => "process",
            Role::Relay => "relay",
            Role::Prune => "prune",
            Role::Reconcile => "reconcile",
            Role::Console => "console",
        }
    }
}

/// The roles an instance serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roles {
    roles: BTreeSet<Role>,
    /// Named by the operator: a role that cannot run (the relay without a
    /// sink, reconcile without a source) is then an error at start-up, not
    /// skipped.
    pub(super) named: bool,
}

impl Default for Roles {
    /// Every role but the console; the relay and reconcile where they are configured.
    fn default() -> Self {
        Roles { roles: Role::ALL.into_iter().filter(|r| *r != Role::Console).collect(), named: false }
    }
}

impl Roles {
    /// `receive,process` (comma-separated names of [`Role`]s), or `all` (the console included).
    pub fn parse(text: &str) -> Result<Roles, String> {
        let mut roles = BTreeSet::new();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "all" {
                roles.extend(Role::ALL);
                continue;
            }
            let role = Role::ALL.into_iter().find(|r| r.as_str() == name).ok_or_else(|| {
                format!(
                    "{:?} is not a role: receive, process, relay, prune, reconcile, console, or all",
                    webhook_inbox_schemes::text::escape(name)
                )
            })?;
            roles.insert(role);
        }
        if roles.is_empty() {
            return Err("no role named: receive, process, relay, prune, reconcile, console, or all".into());
        }
        Ok(Roles { roles, named: true })
    }

    /// Every role, the console included, each where it is configured (`inbox dev`).
    pub(crate) fn everything() -> Roles {
        Roles { roles: Role::ALL.into_iter().collect(), named: false }
    }

    /// Whether `role` is one of them.
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    /// Their names, comma-separated.
    pub fn names(&self) -> String {
        self.roles.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(",")
    }
}
