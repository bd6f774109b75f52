//! Reading a server-sent events body: the `data:` payloads, the chat
//! chunks they carry, and what a streamed chat said.

use serde_json::Value;

/// The payloads of the `data: ` events of `body`, in order; events of
/// other fields (comments, `event:`) are skipped.
pub fn data(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect()
}

/// The payloads of a body in which every event is one `data: ` line
/// ending with a blank line; panics naming the first that is not.
pub fn strict_data(body: &str) -> Vec<&str> {
    assert!(
        body.ends_with("\n\n"),
        "events end with a blank line: {body:?}"
    );
    body.split_terminator("\n\n")
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without a data: prefix: {e:?}"))
        })
        .collect()
}

/// The `data: ` payloads parsed as JSON, `[DONE]` as `Value::Null`.
pub fn events(body: &str) -> Vec<Value> {
    data(body)
        .into_iter()
        .map(|d| {
            if d == "[DONE]" {
                Value::Null
            } else {
                serde_json::from_str(d).unwrap_or_else(|e| panic!("event not JSON ({e}): {d}"))
            }
        })
        .collect()
}

/// The chat chunks' content deltas, joined.
pub fn streamed_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

/// The first finish reason a chunk carries.
pub fn finish_reason(events: &[Value]) -> Option<String> {
    events
        .iter()
        .find_map(|e| e["choices"][0]["finish_reason"].as_str().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = ": keep-alive\n\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"length\"}]}\n\n\
        data: [DONE]\n\n";

    #[test]
    fn events_text_and_finish_reason() {
        let events = events(BODY);
        assert_eq!(events.len(), 3);
        assert_eq!(events[2], Value::Null);
        assert_eq!(streamed_text(&events), "Hello");
        assert_eq!(finish_reason(&events).as_deref(), Some("length"));
    }

    #[test]
    fn strict_reading_takes_every_event() {
        assert_eq!(strict_data("data: a\n\ndata: b\n\n"), ["a", "b"]);
    }

    #[test]
    #[should_panic(expected = "without a data: prefix")]
    fn strict_reading_refuses_other_fields() {
        strict_data(BODY);
    }
}
