//! Property-style robustness of the Messages API parser: over byte-level
//! mutations of valid bodies, random values spliced in at any depth and
//! deep nesting, `parse_messages_request` never panics, and a refusal is a
//! 400 whose message starts with the path it names (when it names one).
//! Bounded so it runs in about a second.

use iris_openai::anthropic::{parse_messages_request, MessagesCall};
use iris_openai::ParseOptions;
use iris_testkit::Rng;
use serde_json::{json, Value};

fn seeds() -> Vec<Value> {
    vec![
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "s"}],
               "stop_sequences": ["a"], "temperature": 0.5, "top_k": 3, "stream": true,
               "metadata": {"user_id": "u"},
               "messages": [
                 {"role": "user", "content": [
                   {"type": "text", "text": "t", "cache_control": {"type": "ephemeral"}},
                   {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]},
                 {"role": "assistant", "content": [
                   {"type": "thinking", "thinking": "h", "signature": "s"},
                   {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
                 {"role": "user", "content": [
                   {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "r"}]}]}],
               "tools": [{"name": "f", "input_schema": {"type": "object"}}],
               "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}),
        json!({"model": "m", "max_tokens": 4000, "messages": [{"role": "user", "content": "x"}],
               "thinking": {"type": "enabled", "budget_tokens": 2000},
               "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}),
    ]
}

fn check(body: &[u8]) -> bool {
    for call in [MessagesCall::Create, MessagesCall::CountTokens] {
        match parse_messages_request(body, call, &ParseOptions::default()) {
            Ok(chat) => {
                let _ = chat.sampling();
                assert!(!chat.messages.is_empty());
                if call == MessagesCall::Create {
                    return true;
                }
            }
            Err(e) => {
                assert_eq!(e.status, 400, "{e:?}");
                if let Some(param) = &e.param {
                    assert!(e.message.starts_with(param.as_str()), "{e:?}");
                }
            }
        }
    }
    false
}

fn random_value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth > 3 { 7 } else { 10 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => json!(rng.next_u64() as i64),
        3 => json!((rng.next_u64() % 5) as i64 - 2),
        4 => json!(f64::from((rng.next_u64() % 300) as u32) / 100.0),
        5 => json!(
            [
                "",
                "user",
                "text",
                "image",
                "tool_use",
                "tool_result",
                "thinking",
                "base64",
                "url",
                "any",
                "tool",
                "é😀"
            ][rng.below(12)]
        ),
        6 => json!(rng.next_u64() % 3000),
        7 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "type",
                "text",
                "source",
                "content",
                "role",
                "name",
                "input",
                "id",
                "tool_use_id",
                "data",
                "media_type",
                "x",
            ];
            let mut map = serde_json::Map::new();
            for _ in 0..rng.below(4) {
                map.insert(
                    keys[rng.below(keys.len())].into(),
                    random_value(rng, depth + 1),
                );
            }
            Value::Object(map)
        }
    }
}

fn splice(rng: &mut Rng, v: &mut Value, depth: usize) {
    let here = rng.below(3) == 0 || depth > 5;
    match v {
        Value::Object(map) if !map.is_empty() && !here => {
            let key = map
                .keys()
                .nth(rng.below(map.len()))
                .cloned()
                .unwrap_or_default();
            if let Some(child) = map.get_mut(&key) {
                splice(rng, child, depth + 1);
            }
        }
        Value::Array(items) if !items.is_empty() && !here => {
            let i = rng.below(items.len());
            splice(rng, &mut items[i], depth + 1);
        }
        _ => *v = random_value(rng, depth),
    }
}

#[test]
fn spliced_values_never_panic() {
    let mut rng = Rng(11);
    let seeds = seeds();
    let mut accepted = 0;
    for _ in 0..5000 {
        let mut v = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(3) {
            splice(&mut rng, &mut v, 0);
        }
        if check(&serde_json::to_vec(&v).unwrap_or_default()) {
            accepted += 1;
        }
    }
    assert!(accepted > 0, "some mutations stay valid");
}

#[test]
fn mutated_bytes_never_panic() {
    let mut rng = Rng(12);
    let seeds: Vec<Vec<u8>> = seeds()
        .iter()
        .map(|v| serde_json::to_vec(v).unwrap_or_default())
        .collect();
    for _ in 0..3000 {
        let mut body = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(body.len() + 1);
            match rng.below(3) {
                0 if i < body.len() => body[i] = rng.next_u64() as u8,
                1 => body.insert(i, b"{}[]\",:0"[rng.below(8)]),
                _ => body.truncate(i),
            }
        }
        check(&body);
    }
}

#[test]
fn deep_nesting_is_refused() {
    let depth = 50_000;
    let deep = format!("{}\"x\"{}", "[".repeat(depth), "]".repeat(depth));
    let body = format!(
        r#"{{"model":"m","max_tokens":1,"messages":[{{"role":"user","content":{deep}}}]}}"#
    );
    check(body.as_bytes());
    let blocks = format!(
        "{}{}",
        r#"{"type":"tool_result","tool_use_id":"t","content":["#.repeat(200),
        "]}".repeat(200)
    );
    let body = format!(
        r#"{{"model":"m","max_tokens":1,"messages":[{{"role":"user","content":[{blocks}]}}]}}"#
    );
    check(body.as_bytes());
}
