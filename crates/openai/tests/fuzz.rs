//! Property-style robustness: `parse_chat_request` never panics and always
//! answers 400 on failure, over random bytes, byte-level mutations of valid
//! bodies, random JSON values spliced into every field, and deep nesting.
//! Bounded so it runs in a second or two.

use iris_openai::{parse_chat_request, ChatCompletionRequest};
use serde_json::{json, Value};

use iris_testkit::Rng;

fn seed_bodies() -> Vec<Value> {
    vec![
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
               "messages": [{"role": "system", "content": "s"},
                            {"role": "user", "content": [{"type": "text", "text": "t"},
                              {"type": "image_url", "image_url": {"url": "u", "detail": "low"}}]},
                            {"role": "assistant", "content": null}],
               "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "stop": ["a", "b"],
               "n": 1, "seed": 3, "min_tokens": 1, "ignore_eos": false}),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
                 "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}},
                            "required": ["a"], "$defs": {"b": {"enum": [1]}}}}}}),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "regex": "[a-z]+"}),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "structural_tag": {"type": "t", "structures": []}}),
    ]
}

/// Checks the outcome: success yields a usable request, failure a 400.
fn check(body: &[u8]) {
    match parse_chat_request(body) {
        Ok(req) => exercise(&req),
        Err(e) => {
            assert_eq!(e.status, 400, "{e:?}");
            assert!(!e.message.is_empty());
            let _: Value = serde_json::from_slice(&e.body()).expect("error body is JSON");
        }
    }
}

fn exercise(req: &ChatCompletionRequest) {
    let s = req.sampling();
    assert!(s.stop.len() <= 16);
    let _ = req.include_usage();
    for m in &req.messages {
        let _ = m.text_content();
    }
}

fn random_value(rng: &mut Rng, depth: usize) -> Value {
    let pick = if depth > 3 {
        rng.below(7)
    } else {
        rng.below(10)
    };
    match pick {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => json!(rng.next_u64() as i64),
        3 => json!((rng.next_u64() % 7) as i64 - 3),
        4 => json!(f64::from((rng.next_u64() % 1000) as u32) / 100.0 - 3.0),
        5 => json!(["", "user", "text", "image_url", "assistant", "\u{0}", "é😀"][rng.below(7)]),
        6 => json!(rng.next_u64() % 20),
        7 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "type",
                "text",
                "image_url",
                "url",
                "role",
                "content",
                "detail",
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

/// Replaces a random node (any depth) of `v` with a random value.
fn splice(rng: &mut Rng, v: &mut Value, depth: usize) {
    let stop_here = rng.below(3) == 0 || depth > 4;
    match v {
        Value::Object(map) if !map.is_empty() && !stop_here => {
            let key = map
                .keys()
                .nth(rng.below(map.len()))
                .cloned()
                .unwrap_or_default();
            if let Some(child) = map.get_mut(&key) {
                splice(rng, child, depth + 1);
            }
        }
        Value::Array(items) if !items.is_empty() && !stop_here => {
            let i = rng.below(items.len());
            splice(rng, &mut items[i], depth + 1);
        }
        _ => *v = random_value(rng, depth),
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(1);
    let alphabet = b"{}[]\":,0123456789-+.eEtruefalsn \\u\n\x00\xff\xc3\xa9";
    for _ in 0..3000 {
        let len = rng.below(64);
        let body: Vec<u8> = (0..len)
            .map(|_| alphabet[rng.below(alphabet.len())])
            .collect();
        check(&body);
    }
}

#[test]
fn mutated_bodies_never_panic() {
    let mut rng = Rng(2);
    let seeds: Vec<Vec<u8>> = seed_bodies()
        .iter()
        .map(|v| serde_json::to_vec(v).unwrap_or_default())
        .collect();
    for _ in 0..5000 {
        let mut body = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(body.len() + 1);
            match rng.below(4) {
                0 if i < body.len() => body[i] = rng.next_u64() as u8,
                1 if i < body.len() => {
                    body.remove(i);
                }
                2 => body.insert(i, b"{}[]\",:0-9"[rng.below(10)]),
                _ => body.truncate(i),
            }
        }
        check(&body);
    }
}

#[test]
fn spliced_values_never_panic() {
    let mut rng = Rng(3);
    let seeds = seed_bodies();
    let mut accepted = 0;
    for _ in 0..5000 {
        let mut v = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(3) {
            splice(&mut rng, &mut v, 0);
        }
        let body = serde_json::to_vec(&v).unwrap_or_default();
        if parse_chat_request(&body).is_ok() {
            accepted += 1;
        }
        check(&body);
    }
    assert!(accepted > 0, "some mutations stay valid");
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
        let depth = 100_000;
        let deep = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        check(deep.as_bytes());
        let in_field = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"extra":{deep}}}"#
        );
        check(in_field.as_bytes());
        let in_content =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":{deep}}}]}}"#);
        check(in_content.as_bytes());
    }
}
