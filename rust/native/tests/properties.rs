//! Property tests: arbitrary input never panics, and every error names the value it refuses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use _native::address::{AddressError, parse_bind_address};
use _native::server::{StartError, validate_snapshot};
use proptest::prelude::*;

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        any::<String>().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::from),
            prop::collection::btree_map(any::<String>(), inner, 0..8)
                .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn any_host_and_port_parse_or_fail_naming_the_value(host in any::<String>(), port in any::<i64>()) {
        match parse_bind_address(&host, port) {
            Ok(addr) => {
                prop_assert_eq!(i64::from(addr.port()), port);
            }
            Err(err @ AddressError::PortOutOfRange(_)) => {
                prop_assert!(!(0..=65535).contains(&port));
                prop_assert!(err.to_string().contains(&port.to_string()));
            }
            Err(err @ AddressError::NotAnAddress(_)) => {
                prop_assert!((0..=65535).contains(&port));
                prop_assert!(err.to_string().contains(&format!("{host:?}")), "{}", err);
            }
        }
    }

    #[test]
    fn host_like_strings_never_panic(host in "[\\[\\]0-9a-fA-F:.%a-z ]{0,48}", port in 0i64..=65535) {
        let _ = parse_bind_address(&host, port);
    }

    #[test]
    fn every_ipv4_literal_round_trips(octets in any::<[u8; 4]>(), port in any::<u16>()) {
        let ip = Ipv4Addr::from(octets);
        let parsed = parse_bind_address(&ip.to_string(), i64::from(port)).unwrap();
        prop_assert_eq!(parsed, SocketAddr::new(IpAddr::V4(ip), port));
    }

    #[test]
    fn every_ipv6_literal_round_trips_bare_and_bracketed(segments in any::<[u16; 8]>(), port in any::<u16>()) {
        let ip = Ipv6Addr::from(segments);
        let expected = SocketAddr::new(IpAddr::V6(ip), port);
        prop_assert_eq!(parse_bind_address(&ip.to_string(), i64::from(port)).unwrap(), expected);
        prop_assert_eq!(parse_bind_address(&format!("[{ip}]"), i64::from(port)).unwrap(), expected);
    }

    #[test]
    fn any_string_is_validated_without_panicking_and_errors_quote_it(json in any::<String>()) {
        if let Err(err) = validate_snapshot(&json) {
            prop_assert!(matches!(err, StartError::InvalidJson(_)));
            let start: String = json.chars().take(40).collect();
            prop_assert!(err.to_string().contains(&format!("{start:?}")), "{}", err);
        }
    }

    #[test]
    fn every_json_object_is_accepted_and_every_other_value_refused(value in json_value()) {
        let text = serde_json::to_string(&value).unwrap();
        prop_assert_eq!(validate_snapshot(&text).is_ok(), value.is_object(), "{}", text);
    }

    #[test]
    fn truncated_objects_are_refused(value in json_value(), cut in any::<prop::sample::Index>()) {
        let text = serde_json::to_string(&serde_json::json!({"v": value})).unwrap();
        let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        let end = boundaries[cut.index(boundaries.len())];
        prop_assert!(validate_snapshot(&text[..end]).is_err(), "{}", &text[..end]);
    }
}

#[test]
fn deeply_nested_input_is_refused_without_overflowing_the_stack() {
    for depth in [1_000, 100_000] {
        let arrays = format!("{{\"a\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
        let objects = format!("{}{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        for text in [arrays, objects] {
            let err = validate_snapshot(&text).unwrap_err();
            assert!(err.to_string().contains("recursion limit"), "{err}");
        }
    }
}
