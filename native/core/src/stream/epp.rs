//! The Gateway API Inference Extension's endpoint-picker protocol, as Envoy carries it to and from
//! extproc: the subset hint a filter before extproc may set (the engines it may pick from), the
//! destination value (the primary, then fallbacks in order), and the engine that actually served.

use std::collections::BTreeMap;

use crate::contracts::{
    LB_METADATA_NAMESPACE, SERVED_ENDPOINT_KEY, SUBSET_HINT_KEY, SUBSET_HINT_NAMESPACE, UPSTREAM_ADDRESS_ATTRIBUTE,
};
use crate::pb::ext_proc::Metadata;
use crate::pb::structs::{value, Struct};

/// The addresses the subset hint allows; `None` when there is no hint (any engine may be picked).
/// A list of strings per the protocol; a comma-separated string is accepted too.
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let value = metadata?
        .filter_metadata
        .get(SUBSET_HINT_NAMESPACE)?
        .fields
        .get(SUBSET_HINT_KEY)?;
    let addresses = match &value.kind {
        Some(value::Kind::ListValue(list)) => list
            .values
            .iter()
            .filter_map(|v| v.as_str())
            .map(|s| s.trim().to_string())
            .collect(),
        Some(value::Kind::StringValue(s)) => s.split(',').map(|a| a.trim().to_string()).collect(),
        _ => Vec::new(),
    };
    Some(addresses.into_iter().filter(|a| !a.is_empty()).collect())
}

/// The engine that served, as the data plane reports it with the response headers: the protocol's
/// `envoy.lb` / `x-gateway-destination-endpoint-served` metadata first, else the `upstream.address`
/// attribute (Envoy fills that one when asked, whatever its load-balancing policy); `None` when
/// neither came (the primary served, as far as extproc knows).
pub fn served_endpoint<'a>(
    metadata: Option<&'a Metadata>,
    attributes: &'a BTreeMap<String, Struct>,
) -> Option<&'a str> {
    metadata
        .and_then(|m| m.filter_metadata.get(LB_METADATA_NAMESPACE))
        .and_then(|lb| lb.fields.get(SERVED_ENDPOINT_KEY))
        .and_then(|v| v.as_str())
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .or_else(|| upstream_address(attributes))
}

/// The upstream address Envoy reports on the response headers, if it was asked to.
fn upstream_address(attributes: &BTreeMap<String, Struct>) -> Option<&str> {
    attributes
        .values()
        .find_map(|s| s.fields.get(UPSTREAM_ADDRESS_ATTRIBUTE))
        .and_then(|v| v.as_str())
        .filter(|a| !a.is_empty())
}

/// The destination header and metadata value: `primary[,fallback...]`, at most `max_fallbacks` of them.
pub fn destination(
    primary: &str,
    fallbacks: impl IntoIterator<Item = impl AsRef<str>>,
    max_fallbacks: usize,
) -> String {
    let mut value = primary.to_string();
    for fallback in fallbacks.into_iter().take(max_fallbacks) {
        value.push(',');
        value.push_str(fallback.as_ref());
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::structs::Value;

    fn metadata(value: Value) -> Metadata {
        let mut hint = Struct::default();
        hint.fields.insert(SUBSET_HINT_KEY.to_string(), value);
        let mut m = Metadata::default();
        m.filter_metadata.insert(SUBSET_HINT_NAMESPACE.to_string(), hint);
        m
    }

    #[test]
    fn subset_hint_reads_a_list_or_a_comma_string() {
        assert_eq!(subset_hint(None), None);
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
        let list = metadata(Value::list(vec![
            Value::string("10.0.0.1:8000"),
            Value::string("10.0.0.2:8000"),
        ]));
        assert_eq!(
            subset_hint(Some(&list)).unwrap(),
            vec!["10.0.0.1:8000".to_string(), "10.0.0.2:8000".to_string()]
        );
        let joined = metadata(Value::string("10.0.0.1:8000, 10.0.0.3:8000"));
        assert_eq!(
            subset_hint(Some(&joined)).unwrap(),
            vec!["10.0.0.1:8000", "10.0.0.3:8000"]
        );
        // Present but empty: nothing may be picked (the caller answers 503).
        assert_eq!(
            subset_hint(Some(&metadata(Value::list(Vec::new())))).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn upstream_address_is_found_under_any_filter_name() {
        let mut attrs = Struct::default();
        attrs
            .fields
            .insert(UPSTREAM_ADDRESS_ATTRIBUTE.to_string(), Value::string("10.0.0.2:8000"));
        let map = BTreeMap::from([("envoy.filters.http.ext_proc".to_string(), attrs)]);
        assert_eq!(upstream_address(&map), Some("10.0.0.2:8000"));
        assert_eq!(upstream_address(&BTreeMap::new()), None);
    }

    #[test]
    fn the_served_metadata_wins_over_the_upstream_attribute() {
        let mut attrs = Struct::default();
        attrs
            .fields
            .insert(UPSTREAM_ADDRESS_ATTRIBUTE.to_string(), Value::string("10.0.0.2:8000"));
        let attributes = BTreeMap::from([("envoy.filters.http.ext_proc".to_string(), attrs)]);
        let mut lb = Struct::default();
        lb.fields
            .insert(SERVED_ENDPOINT_KEY.to_string(), Value::string("10.0.0.3:8000"));
        let mut served = Metadata::default();
        served.filter_metadata.insert(LB_METADATA_NAMESPACE.to_string(), lb);
        assert_eq!(served_endpoint(Some(&served), &attributes), Some("10.0.0.3:8000"));
        assert_eq!(served_endpoint(None, &attributes), Some("10.0.0.2:8000"));
        // The namespace without the key (only extproc's own destination in it): the attribute decides.
        let mut only_destination = Metadata::default();
        only_destination
            .filter_metadata
            .insert(LB_METADATA_NAMESPACE.to_string(), Struct::default());
        assert_eq!(
            served_endpoint(Some(&only_destination), &attributes),
            Some("10.0.0.2:8000")
        );
        assert_eq!(served_endpoint(None, &BTreeMap::new()), None);
    }

    #[test]
    fn destination_lists_the_primary_then_bounded_fallbacks() {
        assert_eq!(destination("a:1", ["b:2", "c:3"], 0), "a:1");
        assert_eq!(destination("a:1", ["b:2", "c:3"], 1), "a:1,b:2");
        assert_eq!(destination("a:1", ["b:2", "c:3"], 5), "a:1,b:2,c:3");
    }
}
