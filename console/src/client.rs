//! Who a client is, for the console's limits (and a listener's share of
//! requests per client).

use std::net::SocketAddr;

use webhook_inbox::config::{ConfigError, Env};

/// Where a client's address is taken from (`INBOX_CONSOLE_CLIENT_IP`), for
/// the console's limits (sign-in, the API's failed tokens, each client's
/// share of requests): the connection (`peer`, the default), or, behind a
/// load balancer that appends it (an ALB does), the last address of
/// `X-Forwarded-For` (`x-forwarded-for`). Behind a balancer, `peer` counts
/// every client as the balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientIp {
    /// The connection's address.
    Peer,
    /// The last address of `X-Forwarded-For`, as the balancer appended it.
    ForwardedFor,
}

impl ClientIp {
    /// `INBOX_CONSOLE_CLIENT_IP`: `peer` (the default) or `x-forwarded-for`.
    pub fn read(env: &Env) -> Result<ClientIp, ConfigError> {
        match env.var("INBOX_CONSOLE_CLIENT_IP").as_deref() {
            None | Some("peer") => Ok(ClientIp::Peer),
            Some("x-forwarded-for") => Ok(ClientIp::ForwardedFor),
            Some(other) => Err(ConfigError::Invalid {
                var: "INBOX_CONSOLE_CLIENT_IP".into(),
                reason: format!("{:?} is neither peer nor x-forwarded-for", webhook_inbox_schemes::text::escape(other)),
            }),
        }
    }

    /// The client's address: the connection's, or the last of
    /// `X-Forwarded-For`; an address as an address, anything else a balancer
    /// passed on escaped (it reaches the log), "unknown" without either.
    pub fn client(self, headers: &http::HeaderMap, peer: Option<SocketAddr>) -> String {
        let forwarded = (self == ClientIp::ForwardedFor)
            .then(|| {
                let all = headers.get_all("x-forwarded-for");
                let last = all.iter().filter_map(|v| v.to_str().ok()).next_back()?;
                Some(last.rsplit(',').next()?.trim().chars().take(64).collect::<String>())
            })
            .flatten()
            .filter(|a| !a.is_empty());
        let addr = forwarded.or_else(|| peer.map(|p| p.ip().to_string()));
        let addr = addr.map(|a| match a.parse::<std::net::IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => webhook_inbox_schemes::text::escape(&a).into_owned(),
        });
        addr.unwrap_or_else(|| "unknown".into())
    }
}

/// What a client is counted as by the limits: its address, an IPv6 address
/// by its /64 (what one host is given), an IPv4-mapped one as the IPv4;
/// anything else (not an address) as itself.
pub fn client_key(client: &str) -> String {
    match client.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
        Ok(v4) => v4.to_string(),
        Err(_) => client.to_string(),
    }
}
