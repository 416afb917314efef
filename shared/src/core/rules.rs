//! Ignore rules: the events a team never wants, declared in a TOML file
//! (`INBOX_RULES_FILE`, or its text in `INBOX_RULES`), no code. An event a
//! rule matches is still claimed (a redelivery stays a duplicate) and ends
//! `ignored`: no handler runs, it is kept like `done` for retention, and it
//! can be requeued like `unhandled`.
//!
//! ```toml
//! [[ignore]]
//! provider = "github"
//! type = "ping"
//!
//! [[ignore]]
//! name = "test-mode charges"
//! provider = "stripe"
//! type = "charge.*"                  # a trailing * matches a prefix; no type: every type
//! when = [                           # every condition must hold
//!     { pointer = "/livemode", equals = false },
//!     { pointer = "/data/object/currency", one_of = ["usd", "eur"] },
//!     { pointer = "/data/object/metadata/test_run", exists = true },
//! ]
//! ```
//!
//! A pointer is a JSON Pointer (RFC 6901) into the event's payload. The file
//! is checked whole when it is read: an unknown key, a bad pointer, a
//! condition with no test or with two are refused, naming the rule and the key.

use serde::Deserialize;
use serde_json::Value;

use webhook_inbox_schemes::{text::escape, Provider};

/// The ignore rules of one file, in its order (the first that matches names the event's rule).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IgnoreRules {
    ignore: Vec<IgnoreRule>,
}

/// One `[[ignore]]` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct IgnoreRule {
    name: String,
    provider: Provider,
    event_type: TypePattern,
    when: Vec<Condition>,
}

#[derive(Clone, Debug, PartialEq)]
enum TypePattern {
    Any,
    Exact(String),
    Prefix(String),
}

#[derive(Clone, Debug, PartialEq)]
struct Condition {
    pointer: String,
    test: Test,
}

#[derive(Clone, Debug, PartialEq)]
enum Test {
    Equals(Value),
    OneOf(Vec<Value>),
    Exists(bool),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    ignore: Vec<IgnoreEntry>,
    // The [[alert]] entries are the alerts' (crate::alerts::AlertRules).
    #[serde(default, rename = "alert")]
    _alert: Vec<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IgnoreEntry {
    name: Option<String>,
    provider: String,
    #[serde(rename = "type")]
    event_type: Option<String>,
    #[serde(default)]
    when: Vec<ConditionEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConditionEntry {
    pointer: String,
    equals: Option<toml::Value>,
    one_of: Option<Vec<toml::Value>>,
    exists: Option<bool>,
}

impl IgnoreRules {
    /// Reads and checks a rules file's text; the error names the rule and the key.
    pub fn parse(text: &str) -> Result<IgnoreRules, String> {
        let file: File = toml::from_str(text).map_err(|e| webhook_inbox_schemes::text::toml_error(text, &e))?;
        let ignore = file.ignore.into_iter().enumerate().map(|(i, entry)| IgnoreRule::new(i + 1, entry));
        Ok(IgnoreRules { ignore: ignore.collect::<Result<_, _>>()? })
    }

    /// No rules.
    pub fn is_empty(&self) -> bool {
        self.ignore.is_empty()
    }

    /// The rules, in the file's order.
    pub fn ignore_rules(&self) -> &[IgnoreRule] {
        &self.ignore
    }

    /// The first rule that ignores this event. `payload` is read only by a
    /// rule with conditions, and only once its provider and type match.
    pub fn ignoring(&self, provider: Provider, event_type: &str, payload: Option<&str>) -> Option<&IgnoreRule> {
        let mut parsed: Option<Option<Value>> = None;
        self.ignore.iter().find(|rule| {
            if !rule.matches_type(provider, event_type) {
                return false;
            }
            if rule.when.is_empty() {
                return true;
            }
            let payload = parsed.get_or_insert_with(|| payload.and_then(|p| serde_json::from_str(p).ok()));
            payload.as_ref().is_some_and(|p| rule.when.iter().all(|c| c.holds(p)))
        })
    }

    /// `LIKE` patterns (`provider:type`, `\` escaping) of the events whose
    /// payload a rule reads, for the worker's take to fetch it.
    pub(crate) fn payload_patterns(&self) -> Vec<String> {
        let like = |s: &str| s.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
        self.ignore
            .iter()
            .filter(|r| !r.when.is_empty())
            .map(|r| match &r.event_type {
                TypePattern::Any => format!("{}:%", like(r.provider.as_str())),
                TypePattern::Exact(t) => format!("{}:{}", like(r.provider.as_str()), like(t)),
                TypePattern::Prefix(p) => format!("{}:{}%", like(r.provider.as_str()), like(p)),
            })
            .collect()
    }
}

impl IgnoreRule {
    fn new(number: usize, entry: IgnoreEntry) -> Result<IgnoreRule, String> {
        let label = match &entry.name {
            Some(name) => format!("[[ignore]] #{number} ({})", escape(name)),
            None => format!("[[ignore]] #{number}"),
        };
        let at = |key: &str, reason: String| format!("{label} {key}: {reason}");
        if entry.name.as_ref().is_some_and(|n| n.trim().is_empty() || n.chars().count() > 100) {
            return Err(at("name", "1 to 100 characters".into()));
        }
        let provider = Provider::try_from(entry.provider.as_str())
            .map_err(|_| at("provider", format!("{} is not a provider name", quoted(&entry.provider))))?;
        let event_type = match entry.event_type.as_deref() {
            None | Some("*") => TypePattern::Any,
            Some(t) if t.is_empty() || t.chars().count() > 128 => {
                return Err(at("type", "1 to 128 characters (leave it out for every type)".into()))
            }
            Some(t) => match t.strip_suffix('*') {
                Some(prefix) if !prefix.contains('*') => TypePattern::Prefix(prefix.into()),
                None if !t.contains('*') => TypePattern::Exact(t.into()),
                _ => return Err(at("type", format!("{}: only a trailing * matches (a prefix)", quoted(t)))),
            },
        };
        let when = entry
            .when
            .into_iter()
            .enumerate()
            .map(|(i, c)| Condition::new(c).map_err(|reason| at(&format!("when #{}", i + 1), reason)))
            .collect::<Result<_, _>>()?;
        let name = entry.name.unwrap_or_else(|| format!("#{number}"));
        Ok(IgnoreRule { name, provider, event_type, when })
    }

    /// Its `name`, or `#N` (its place in the file).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The provider it is about.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// The type as written (`charge.*`), `*` for every type.
    pub fn event_type(&self) -> String {
        match &self.event_type {
            TypePattern::Any => "*".into(),
            TypePattern::Exact(t) => t.clone(),
            TypePattern::Prefix(p) => format!("{p}*"),
        }
    }

    /// Whether it has payload conditions.
    pub fn has_conditions(&self) -> bool {
        !self.when.is_empty()
    }

    fn matches_type(&self, provider: Provider, event_type: &str) -> bool {
        provider == self.provider
            && match &self.event_type {
                TypePattern::Any => true,
                TypePattern::Exact(t) => t == event_type,
                TypePattern::Prefix(p) => event_type.starts_with(p.as_str()),
            }
    }
}

impl Condition {
    fn new(entry: ConditionEntry) -> Result<Condition, String> {
        check_pointer(&entry.pointer).map_err(|reason| format!("pointer {}: {reason}", quoted(&entry.pointer)))?;
        let json = |v: toml::Value| match v {
            toml::Value::Datetime(_) => Err("a date-time is not a JSON value (write it as a string)".to_string()),
            v => serde_json::to_value(v).map_err(|e| e.to_string()),
        };
        let test = match (entry.equals, entry.one_of, entry.exists) {
            (Some(v), None, None) => Test::Equals(json(v).map_err(|e| format!("equals: {e}"))?),
            (None, Some(vs), None) if vs.is_empty() => return Err("one_of: an empty list matches nothing".into()),
            (None, Some(vs), None) => {
                Test::OneOf(vs.into_iter().map(json).collect::<Result<_, _>>().map_err(|e| format!("one_of: {e}"))?)
            }
            (None, None, Some(exists)) => Test::Exists(exists),
            (None, None, None) => return Err("no test: give one of equals, one_of or exists".into()),
            _ => return Err("one test per condition: equals, one_of or exists".into()),
        };
        Ok(Condition { pointer: entry.pointer, test })
    }

    fn holds(&self, payload: &Value) -> bool {
        let found = payload.pointer(&self.pointer);
        match &self.test {
            Test::Exists(exists) => found.is_some() == *exists,
            Test::Equals(v) => found.is_some_and(|f| same(f, v)),
            Test::OneOf(vs) => found.is_some_and(|f| vs.iter().any(|v| same(f, v))),
        }
    }
}

/// A JSON Pointer (RFC 6901): empty (the whole payload), or `/` tokens where `~` is `~0` or `~1` only.
fn check_pointer(pointer: &str) -> Result<(), String> {
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err("does not start with '/' (a JSON Pointer, e.g. \"/data/object/id\")".into());
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err("'~' is followed by neither 0 nor 1 (write ~0 for '~' and ~1 for '/')".into());
        }
    }
    Ok(())
}

/// A stranger's text in a message: quoted, escaped.
fn quoted(text: &str) -> String {
    format!("\"{}\"", escape(text))
}

/// JSON equality, numbers by value (`1` is `1.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64().is_some_and(|x| Some(x) == y.as_f64()),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| same(a, b)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
    [[ignore]]
    provider = "github"
    type = "ping"

    [[ignore]]
    name = "test-mode charges"
    provider = "stripe"
    type = "charge.*"
    when = [
        { pointer = "/livemode", equals = false },
        { pointer = "/data/object/currency", one_of = ["usd", "eur"] },
        { pointer = "/data/object/metadata/test_run", exists = true },
    ]

    [[ignore]]
    provider = "shopify"
    when = [{ pointer = "/total", equals = 0 }]
    "#;

    fn ignoring<'r>(rules: &'r IgnoreRules, provider: Provider, event_type: &str, payload: &str) -> Option<&'r str> {
        rules.ignoring(provider, event_type, Some(payload)).map(IgnoreRule::name)
    }

    #[test]
    fn a_type_a_prefix_and_conditions_each_decide() {
        let rules = IgnoreRules::parse(EXAMPLE).unwrap();
        assert_eq!(ignoring(&rules, Provider::GITHUB, "ping", "{}"), Some("#1"));
        assert_eq!(ignoring(&rules, Provider::GITHUB, "push", "{}"), None);
        let test_charge =
            r#"{"livemode": false, "data": {"object": {"currency": "eur", "metadata": {"test_run": "7"}}}}"#;
        assert_eq!(ignoring(&rules, Provider::STRIPE, "charge.updated", test_charge), Some("test-mode charges"));
        assert_eq!(ignoring(&rules, Provider::STRIPE, "charge.", test_charge), Some("test-mode charges"));
        assert_eq!(ignoring(&rules, Provider::STRIPE, "charges.updated", test_charge), None, "a prefix, not a glob");
        assert_eq!(ignoring(&rules, Provider::STRIPE, "payment_intent.succeeded", test_charge), None);
        // Each condition must hold.
        let live = test_charge.replace("false", "true");
        assert_eq!(ignoring(&rules, Provider::STRIPE, "charge.updated", &live), None);
        let gbp = test_charge.replace("eur", "gbp");
        assert_eq!(ignoring(&rules, Provider::STRIPE, "charge.updated", &gbp), None);
        let untagged = r#"{"livemode": false, "data": {"object": {"currency": "eur", "metadata": {}}}}"#;
        assert_eq!(ignoring(&rules, Provider::STRIPE, "charge.updated", untagged), None);
        // A payload that is no JSON, or none, meets no condition.
        assert_eq!(ignoring(&rules, Provider::STRIPE, "charge.updated", "not json"), None);
        assert_eq!(rules.ignoring(Provider::STRIPE, "charge.updated", None).map(IgnoreRule::name), None);
        // A stranger's worst: nesting past any parser's depth, a megabyte of it; no condition holds, nothing breaks.
        let deep = format!("{}{}", "[".repeat(500_000), "]".repeat(500_000));
        assert_eq!(ignoring(&rules, Provider::STRIPE, "charge.updated", &deep), None);
        // Numbers compare by value: 0 is 0.0.
        assert_eq!(ignoring(&rules, Provider::SHOPIFY, "orders/paid", r#"{"total": 0.0}"#), Some("#3"));
        assert_eq!(ignoring(&rules, Provider::SHOPIFY, "orders/paid", r#"{"total": "0"}"#), None);
    }

    #[test]
    fn exists_false_and_escaped_pointers() {
        let rules = IgnoreRules::parse(
            r#"[[ignore]]
               provider = "standard"
               type = "*"
               when = [{ pointer = "/data/a~1b/~0c", exists = false }]"#,
        )
        .unwrap();
        assert_eq!(rules.ignore_rules()[0].event_type(), "*");
        assert_eq!(ignoring(&rules, Provider::STANDARD, "x", r#"{"data": {"a/b": {"~c": 1}}}"#), None);
        assert_eq!(ignoring(&rules, Provider::STANDARD, "x", r#"{"data": {"a/b": {"c": 1}}}"#), Some("#1"));
    }

    #[test]
    fn a_bad_rule_is_refused_naming_the_rule_and_the_key() {
        let refused = |text: &str| IgnoreRules::parse(text).unwrap_err();
        let one = |rest: &str| format!("[[ignore]]\nname = \"mine\"\nprovider = \"stripe\"\n{rest}");
        assert_eq!(
            refused(&one(r#"when = [{ pointer = "data/object", exists = true }]"#)),
            r#"[[ignore]] #1 (mine) when #1: pointer "data/object": does not start with '/' (a JSON Pointer, e.g. "/data/object/id")"#
        );
        assert!(refused(&one(r#"when = [{ pointer = "/a~2", exists = true }]"#)).contains("'~' is followed by neither"));
        assert_eq!(
            refused(&one(r#"when = [{ pointer = "/a", equals = 1, exists = true }]"#)),
            "[[ignore]] #1 (mine) when #1: one test per condition: equals, one_of or exists"
        );
        assert!(
            refused(&one(r#"when = [{ pointer = "/a" }]"#)).ends_with("no test: give one of equals, one_of or exists")
        );
        assert!(refused(&one(r#"when = [{ pointer = "/a", one_of = [] }]"#)).contains("an empty list matches nothing"));
        assert!(refused(&one(r#"when = [{ pointer = "/a", equals = 1979-05-27 }]"#)).contains("a date-time"));
        assert_eq!(
            refused(&one(r#"type = "charge.*.updated""#)),
            r#"[[ignore]] #1 (mine) type: "charge.*.updated": only a trailing * matches (a prefix)"#
        );
        assert!(refused(&one(r#"type = """#)).contains("type: 1 to 128 characters"));
        assert!(refused("[[ignore]]\nprovider = \"Stripe!\"").starts_with("[[ignore]] #1 provider: \"Stripe!\" is not"));
        assert!(refused(&one("typo = 1")).starts_with("line 4, column 1: unknown field `typo`, expected one of"));
        assert!(refused("[[ignore]\nprovider = 1").starts_with("line 1, column "), "{}", refused("[[ignore]"));
        assert!(refused("[[ignore]]\ntype = \"ping\"").contains("missing field `provider`"));
        assert!(refused("[[alerts]]\nx = 1").contains("unknown field `alerts`"));
        // A stranger's text in a file is escaped in the message.
        assert!(refused("[[ignore]]\nprovider = \"\\u001b[31m\"").contains(r#""\u{1b}[31m""#));
    }

    #[test]
    fn the_take_fetches_the_payload_only_for_rules_with_conditions() {
        let rules = IgnoreRules::parse(EXAMPLE).unwrap();
        assert_eq!(rules.payload_patterns(), ["stripe:charge.%", "shopify:%"]);
        let odd = IgnoreRules::parse(
            "[[ignore]]\nprovider = \"my_shop\"\ntype = \"100%_off\\\\\"\nwhen = [{ pointer = \"\", exists = true }]",
        )
        .unwrap();
        assert_eq!(odd.payload_patterns(), [r"my\_shop:100\%\_off\\"]);
        assert!(IgnoreRules::parse("").unwrap().is_empty());
    }
}
