//! Building the free-form `google.protobuf.Struct` of GetServerInfo
//! (`server_args`), which Iris workers fill with their role, ports and
//! identity, and the GetLoads timestamp.

use std::collections::BTreeMap;

use prost_types::{value::Kind, Struct, Value};

/// A string value.
pub fn text(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// A number value.
pub fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

/// Now as GetLoads reports it: Unix seconds with milliseconds, `"S.mmm"`.
pub fn timestamp_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:03}", now.as_secs(), now.subsec_millis())
}

/// The string field `key` of `s`, if it is one.
pub fn text_field<'a>(s: &'a Struct, key: &str) -> Option<&'a str> {
    match s.fields.get(key)?.kind.as_ref()? {
        Kind::StringValue(v) => Some(v),
        _ => None,
    }
}

/// The number field `key` of `s`, if it is one.
pub fn number_field(s: &Struct, key: &str) -> Option<f64> {
    match s.fields.get(key)?.kind.as_ref()? {
        Kind::NumberValue(v) => Some(*v),
        _ => None,
    }
}

/// A struct from (key, value) pairs.
pub fn fields<'a>(pairs: impl IntoIterator<Item = (&'a str, Value)>) -> Struct {
    let fields: BTreeMap<String, Value> =
        pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    Struct { fields }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_a_struct() {
        let s = fields([("role", text("prefill")), ("port", number(8998.0))]);
        assert!(matches!(&s.fields["role"].kind, Some(Kind::StringValue(r)) if r == "prefill"));
        assert_eq!(text_field(&s, "role"), Some("prefill"));
        assert_eq!(text_field(&s, "port"), None);
        assert_eq!(number_field(&s, "port"), Some(8998.0));
        assert_eq!(number_field(&s, "missing"), None);
        assert!(matches!(s.fields["port"].kind, Some(Kind::NumberValue(p)) if p == 8998.0));
    }

    #[test]
    fn timestamp_is_seconds_dot_millis() {
        let t = timestamp_now();
        let (secs, millis) = t.split_once('.').expect("a dot");
        assert!(secs.parse::<u64>().expect("seconds") > 1_600_000_000);
        assert_eq!(millis.len(), 3, "{t}");
    }
}
