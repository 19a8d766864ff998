//! Every bound the follower metadata server puts on its clients, with the defaults.
//!
//! The server shares a process with inference and answers anyone on the cluster network, so
//! nothing a client sends may make that process grow or stall: each knob below bounds one
//! resource, none of them can be switched off, and each is a keyword of
//! `start_metadata_server` under the same name (durations in seconds, `_s` suffix).

use std::fmt;
use std::time::Duration;

/// The limits of one server. [`Limits::default`] is what callers get without asking.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Open TCP connections, counted from accept to close (handshaking ones included).
    /// A connection beyond the cap is closed as soon as it is accepted.
    pub max_connections: usize,
    /// A connection that has not sent the 24-byte HTTP/2 client preface by then is closed.
    pub handshake_timeout: Duration,
    /// Total bytes of a GetServerInfo request body (its one message is empty). A larger body
    /// is refused with RESOURCE_EXHAUSTED as soon as the limit is crossed, unread beyond it.
    pub max_request_bytes: usize,
    /// Largest gRPC message any service decodes (GetServerInfo and grpc.health.v1).
    pub max_message_bytes: usize,
    /// SETTINGS_MAX_CONCURRENT_STREAMS: calls (and health watches) open on one connection.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: a request whose headers are larger is refused.
    pub max_header_list_bytes: u32,
    /// Longest a call may take before it is answered (tonic's per-request timeout).
    pub request_timeout: Duration,
    /// HTTP/2 PING sent on every connection this often ...
    pub keepalive_interval: Duration,
    /// ... and the connection is closed if the PING is not acknowledged within this.
    pub keepalive_timeout: Duration,
    /// TCP keepalive idle time; probes then every `tcp_keepalive / 4`, 4 probes.
    pub tcp_keepalive: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            handshake_timeout: Duration::from_secs(5),
            max_request_bytes: 4 * 1024,
            max_message_bytes: 4 * 1024,
            max_concurrent_streams: 100,
            max_header_list_bytes: 16 * 1024,
            request_timeout: Duration::from_secs(10),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            tcp_keepalive: Duration::from_secs(60),
        }
    }
}

/// Largest accepted value of a count or byte limit: well beyond any sane setting, and small
/// enough that every conversion below is lossless.
pub const MAX_COUNT: i64 = 1 << 30;
/// Largest accepted duration (one day): long enough for anything, short enough for tokio.
pub const MAX_SECONDS: f64 = 86_400.0;

/// A limit given a value it cannot take; the message names the keyword and the value.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitError {
    pub name: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={} is invalid: {}",
            self.name, self.value, self.expected
        )
    }
}

impl std::error::Error for LimitError {}

/// A count or byte size in `1..=MAX_COUNT`.
pub fn count(name: &'static str, value: i64) -> Result<usize, LimitError> {
    if (1..=MAX_COUNT).contains(&value) {
        Ok(value as usize)
    } else {
        Err(LimitError {
            name,
            value: value.to_string(),
            expected: "expected an integer from 1 to 1073741824",
        })
    }
}

/// A duration in seconds, finite, above zero and at most `MAX_SECONDS`.
pub fn seconds(name: &'static str, value: f64) -> Result<Duration, LimitError> {
    if value.is_finite() && value > 0.0 && value <= MAX_SECONDS {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(LimitError {
            name,
            value: value.to_string(),
            expected: "expected seconds above 0 and at most 86400",
        })
    }
}

impl Limits {
    /// Every limit as (keyword, value), durations in seconds: what the Python module exports
    /// as `DEFAULT_LIMITS` and the docs list.
    pub fn as_pairs(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("max_connections", self.max_connections as f64),
            ("handshake_timeout_s", self.handshake_timeout.as_secs_f64()),
            ("max_request_bytes", self.max_request_bytes as f64),
            ("max_message_bytes", self.max_message_bytes as f64),
            ("max_concurrent_streams", self.max_concurrent_streams as f64),
            ("max_header_list_bytes", self.max_header_list_bytes as f64),
            ("request_timeout_s", self.request_timeout.as_secs_f64()),
            (
                "keepalive_interval_s",
                self.keepalive_interval.as_secs_f64(),
            ),
            ("keepalive_timeout_s", self.keepalive_timeout.as_secs_f64()),
            ("tcp_keepalive_s", self.tcp_keepalive.as_secs_f64()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outside_the_range_are_refused_naming_keyword_and_value() {
        for bad in [0, -1, i64::MIN, MAX_COUNT + 1] {
            let err = count("max_connections", bad).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(&format!("max_connections={bad}")), "{text}");
        }
        assert_eq!(count("max_connections", 1), Ok(1));
    }

    #[test]
    fn durations_must_be_finite_positive_and_at_most_a_day() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_SECONDS * 2.0] {
            let err = seconds("handshake_timeout_s", bad).unwrap_err();
            assert!(err.to_string().contains("handshake_timeout_s="), "{err}");
        }
        assert_eq!(
            seconds("handshake_timeout_s", 0.25),
            Ok(Duration::from_millis(250))
        );
    }
}
