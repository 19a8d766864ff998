//! Turning the host strings operators write into socket addresses, without DNS.
//!
//! Follower servers bind before SGLang's frontend exists, so a slow or broken resolver
//! must not be able to stall start-up: only `localhost` is special-cased.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressError {
    /// The host is neither an IP literal nor `localhost`.
    NotAnAddress(String),
    /// The port does not fit in 0..=65535.
    PortOutOfRange(i64),
}

impl fmt::Display for AddressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAnAddress(host) => write!(
                f,
                "host {host:?} is not an IP address (use an IPv4/IPv6 literal, [v6], or localhost)"
            ),
            Self::PortOutOfRange(port) => write!(f, "port {port} is outside 0..=65535"),
        }
    }
}

impl std::error::Error for AddressError {}

/// Parses `localhost`, IPv4 literals, bare or bracketed IPv6 literals (`::1`, `[::1]`) and
/// wildcards (`0.0.0.0`, `::`) together with a port (0 asks the kernel for a free one).
pub fn parse_bind_address(host: &str, port: i64) -> Result<SocketAddr, AddressError> {
    let port = u16::try_from(port).map_err(|_| AddressError::PortOutOfRange(port))?;
    let trimmed = host.trim();
    let literal = trimmed
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or(trimmed);
    let ip = if literal.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        literal
            .parse::<IpAddr>()
            .map_err(|_| AddressError::NotAnAddress(host.to_owned()))?
    };
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_documented_host_form() {
        for (host, expected) in [
            ("localhost", "127.0.0.1:7"),
            ("127.0.0.1", "127.0.0.1:7"),
            ("0.0.0.0", "0.0.0.0:7"),
            ("::1", "[::1]:7"),
            ("[::1]", "[::1]:7"),
            ("::", "[::]:7"),
        ] {
            let addr = parse_bind_address(host, 7).unwrap();
            assert_eq!(addr.to_string(), expected, "host {host}");
        }
    }

    #[test]
    fn rejects_names_and_bad_ports_naming_the_value() {
        let err = parse_bind_address("node-1.example", 1).unwrap_err();
        assert!(err.to_string().contains("node-1.example"));
        let err = parse_bind_address("127.0.0.1", 70_000).unwrap_err();
        assert!(err.to_string().contains("70000"));
        assert!(parse_bind_address("127.0.0.1", -1).is_err());
        assert!(parse_bind_address("[::1", 1).is_err());
    }
}
