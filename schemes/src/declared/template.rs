//! Templates: literals and `{placeholders}` (`{timestamp}.{body}`,
//! `{header:X-Acme-Delivery}`, `{json:/id}`), parsed once at start-up.

/// Where a value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `{body}`: the exact bytes.
    Body,
    /// `<NAME>_WEBHOOK_URL`: the public URL the provider was given.
    Url,
    /// `{method}`: the request's method.
    Method,
    /// `{timestamp}`: the signed timestamp's text.
    Timestamp,
    /// Form parameters sorted by name, each as name then value (Twilio).
    FormSorted,
    /// `{body_sha256}`: the body's SHA-256, hex.
    BodyHash,
    /// `{header:Name}`: a header's value.
    Header(String),
    /// `{json:/pointer}`: the body's string or number at a JSON pointer.
    Json(String),
    /// `{form:name}`: a form field of the body.
    Form(String),
    /// An item of the signature header's key-value list.
    Signature(String),
    /// Hex HMAC, with the secret that verified the delivery, of the body's value at a pointer (Zoom's handshake).
    Hmac(String),
}

/// A piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text as written.
    Literal(String),
    /// A placeholder's value.
    Source(Source),
}

/// Literals and placeholders, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(pub Vec<Part>);

impl Template {
    /// `a{body}b`, with `{{` and `}}` for literal braces.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let (mut name, mut closed) = (String::new(), false);
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    if !closed {
                        return Err(format!("{text:?}: a '{{' is not closed"));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Source(Source::parse(&name)?));
                }
                '}' => return Err(format!("{text:?}: a '}}' has no '{{' (write '}}}}' for a literal one)")),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Template(parts))
    }

    pub(super) fn sources(&self) -> impl Iterator<Item = &Source> {
        self.0.iter().filter_map(|p| match p {
            Part::Source(s) => Some(s),
            Part::Literal(_) => None,
        })
    }
}

impl Source {
    pub(super) fn parse(name: &str) -> Result<Source, String> {
        let (kind, arg) = match name.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (name, None),
        };
        let need = |what: &str| -> Result<String, String> {
            match arg {
                Some(a) if !a.is_empty() => Ok(a.to_string()),
                _ => Err(format!("{{{kind}}} needs {what}: {{{kind}:...}}")),
            }
        };
        let plain = |s: Source| if arg.is_some() { Err(format!("{{{kind}}} takes no argument")) } else { Ok(s) };
        match kind {
            "body" => plain(Source::Body),
            "url" => plain(Source::Url),
            "method" => plain(Source::Method),
            "timestamp" => plain(Source::Timestamp),
            "form-sorted" => plain(Source::FormSorted),
            "body-hash" => plain(Source::BodyHash),
            "header" => {
                let h = need("a header name")?;
                http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| format!("{h:?} is not a header name"))?;
                Ok(Source::Header(h))
            }
            "json" => {
                let p = arg.unwrap_or_default();
                if !(p.is_empty() || p.starts_with('/')) {
                    return Err(format!("{{json:{p}}}: a JSON pointer starts with '/' (RFC 6901)"));
                }
                Ok(Source::Json(p.to_string()))
            }
            "form" => need("a form field name").map(Source::Form),
            "signature" => need("a key of the signature header's list").map(Source::Signature),
            "hmac" => match arg {
                Some(p) if p.starts_with('/') => Ok(Source::Hmac(p.to_string())),
                _ => Err("{hmac:<pointer>} needs a JSON pointer: {hmac:/payload/plainToken}".into()),
            },
            other => Err(format!(
                "unknown placeholder {{{other}}} (known: body, url, method, timestamp, form-sorted, body-hash, header:<name>, json:<pointer>, form:<field>, signature:<key>, hmac:<pointer>)"
            )),
        }
    }
}
