//! Every bound the follower metadata server puts on its clients, with the defaults.
//!
//! The server shares a process with inference and answers anyone on the cluster network, so
//! nothing a client sends may make that process grow or stall: each knob below bounds one
//! resource, none of them can be switched off, and each is a keyword of
//! `start_metadata_server` under the same name (durations in seconds, `_s` suffix).

use std::fmt;
use std::time::Duration;

/// Declares [`Limits`], its [`Default`] and [`LIMITS`] from one list: each limit's keyword,
/// field, type and default are written once, and everything else (the pairs the Python
/// module exports, the keyword parser) iterates [`LIMITS`].
macro_rules! limits {
    ($(
        $(#[doc = $doc:literal])*
        $keyword:literal => $field:ident: $ty:ty = $default:expr;
    )*) => {
        /// The limits of one server. [`Limits::default`] is what callers get without asking.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Limits {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for Limits {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        /// Every limit, in the order the stub and `docs/security.md` list them.
        pub const LIMITS: &[Limit] = &[
            $( Limit {
                keyword: $keyword,
                kind: <$ty as LimitValue>::KIND,
                get: |limits| limits.$field.as_number(),
                set: |limits, number| limits.$field = <$ty as LimitValue>::from_number(number),
            }, )*
        ];
    };
}

limits! {
    /// Open TCP connections, counted from accept to close (handshaking ones included).
    /// A connection beyond the cap is closed as soon as it is accepted.
    "max_connections" => max_connections: usize = 256;
    /// A connection that has not sent the 24-byte HTTP/2 client preface by then is closed.
    "handshake_timeout_s" => handshake_timeout: Duration = Duration::from_secs(5);
    /// Total bytes of a GetServerInfo request body (its one message is empty). A larger body
    /// is refused with RESOURCE_EXHAUSTED as soon as the limit is crossed, unread beyond it.
    "max_request_bytes" => max_request_bytes: usize = 4 * 1024;
    /// Largest gRPC message any service decodes (GetServerInfo and grpc.health.v1).
    "max_message_bytes" => max_message_bytes: usize = 4 * 1024;
    /// SETTINGS_MAX_CONCURRENT_STREAMS: calls (and health watches) open on one connection.
    "max_concurrent_streams" => max_concurrent_streams: u32 = 100;
    /// SETTINGS_MAX_HEADER_LIST_SIZE: a request whose headers are larger is refused.
    "max_header_list_bytes" => max_header_list_bytes: u32 = 16 * 1024;
    /// Longest a call may take before it is answered (tonic's per-request timeout).
    "request_timeout_s" => request_timeout: Duration = Duration::from_secs(10);
    /// HTTP/2 PING sent on every connection this often ...
    "keepalive_interval_s" => keepalive_interval: Duration = Duration::from_secs(30);
    /// ... and the connection is closed if the PING is not acknowledged within this.
    "keepalive_timeout_s" => keepalive_timeout: Duration = Duration::from_secs(10);
    /// TCP keepalive idle time; probes then every `tcp_keepalive / 4`, 4 probes.
    "tcp_keepalive_s" => tcp_keepalive: Duration = Duration::from_secs(60);
}

/// Largest accepted value of a count or byte limit: well beyond any sane setting, and small
/// enough that every conversion below is lossless.
pub const MAX_COUNT: i64 = 1 << 30;
/// Largest accepted duration (one day): long enough for anything, short enough for tokio.
pub const MAX_SECONDS: f64 = 86_400.0;

/// What a limit counts: how its value is given and which values it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A count or a size: an integer in `1..=MAX_COUNT`.
    Count,
    /// A duration: seconds, finite, above zero and at most `MAX_SECONDS`.
    Seconds,
}

impl Kind {
    /// The accepted range, as error messages state it.
    pub const fn expected(self) -> &'static str {
        match self {
            Self::Count => "expected an integer from 1 to 1073741824",
            Self::Seconds => "expected seconds above 0 and at most 86400",
        }
    }

    fn accepts(self, number: f64) -> bool {
        match self {
            Self::Count => number.fract() == 0.0 && (1.0..=MAX_COUNT as f64).contains(&number),
            Self::Seconds => number.is_finite() && number > 0.0 && number <= MAX_SECONDS,
        }
    }
}

/// A limit's field type: which kind it is, and its value as a number (seconds for durations).
pub trait LimitValue {
    const KIND: Kind;
    fn as_number(&self) -> f64;
    /// The value of a number its kind accepts.
    fn from_number(number: f64) -> Self;
}

impl LimitValue for usize {
    const KIND: Kind = Kind::Count;
    fn as_number(&self) -> f64 {
        *self as f64
    }
    fn from_number(number: f64) -> Self {
        number as usize
    }
}

impl LimitValue for u32 {
    const KIND: Kind = Kind::Count;
    fn as_number(&self) -> f64 {
        f64::from(*self)
    }
    fn from_number(number: f64) -> Self {
        number as u32
    }
}

impl LimitValue for Duration {
    const KIND: Kind = Kind::Seconds;
    fn as_number(&self) -> f64 {
        self.as_secs_f64()
    }
    fn from_number(number: f64) -> Self {
        Duration::from_secs_f64(number)
    }
}

/// One row of [`LIMITS`]: a keyword of `start_metadata_server` and the field it sets.
pub struct Limit {
    pub keyword: &'static str,
    pub kind: Kind,
    get: fn(&Limits) -> f64,
    set: fn(&mut Limits, f64),
}

impl Limit {
    /// The limit's value in `limits` (seconds for a duration).
    pub fn get(&self, limits: &Limits) -> f64 {
        (self.get)(limits)
    }

    /// Sets the limit in `limits` to `number` (an integer for a count, seconds for a
    /// duration), or says why it cannot take it.
    pub fn set(&self, limits: &mut Limits, number: f64) -> Result<(), LimitError> {
        if !self.kind.accepts(number) {
            return Err(LimitError {
                name: self.keyword,
                value: number.to_string(),
                expected: self.kind.expected(),
            });
        }
        (self.set)(limits, number);
        Ok(())
    }

    /// The row of `keyword`, if it names a limit.
    pub fn named(keyword: &str) -> Option<&'static Limit> {
        LIMITS.iter().find(|limit| limit.keyword == keyword)
    }
}

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

impl Limits {
    /// Every limit with its value here, durations in seconds: what the Python module exports
    /// as `DEFAULT_LIMITS` and the docs list.
    pub fn as_pairs(&self) -> Vec<(&'static Limit, f64)> {
        LIMITS
            .iter()
            .map(|limit| (limit, limit.get(self)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(keyword: &str) -> &'static Limit {
        Limit::named(keyword).unwrap()
    }

    #[test]
    fn counts_outside_the_range_are_refused_naming_keyword_and_value() {
        let mut limits = Limits::default();
        for bad in [0.0, -1.0, i64::MIN as f64, (MAX_COUNT + 1) as f64, 1.5] {
            let err = limit("max_connections").set(&mut limits, bad).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(&format!("max_connections={bad}")), "{text}");
        }
        limit("max_connections").set(&mut limits, 1.0).unwrap();
        assert_eq!(limits.max_connections, 1);
    }

    #[test]
    fn durations_must_be_finite_positive_and_at_most_a_day() {
        let mut limits = Limits::default();
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_SECONDS * 2.0] {
            let err = limit("handshake_timeout_s")
                .set(&mut limits, bad)
                .unwrap_err();
            assert!(err.to_string().contains("handshake_timeout_s="), "{err}");
        }
        limit("handshake_timeout_s").set(&mut limits, 0.25).unwrap();
        assert_eq!(limits.handshake_timeout, Duration::from_millis(250));
    }

    #[test]
    fn every_limit_reads_back_what_it_was_set_to() {
        let mut limits = Limits::default();
        for (index, row) in LIMITS.iter().enumerate() {
            let number = (index + 2) as f64;
            row.set(&mut limits, number).unwrap();
            assert_eq!(row.get(&limits), number, "{}", row.keyword);
        }
        let keywords: Vec<_> = LIMITS.iter().map(|row| row.keyword).collect();
        let paired: Vec<_> = limits
            .as_pairs()
            .iter()
            .map(|(row, _)| row.keyword)
            .collect();
        assert_eq!(keywords, paired);
    }

    #[test]
    fn duration_keywords_end_in_s_and_the_range_texts_name_the_bounds() {
        for row in LIMITS {
            assert_eq!(
                row.keyword.ends_with("_s"),
                row.kind == Kind::Seconds,
                "{}",
                row.keyword
            );
        }
        assert!(Kind::Count.expected().contains(&MAX_COUNT.to_string()));
        assert!(Kind::Seconds.expected().contains(&format!("{MAX_SECONDS}")));
    }
}
