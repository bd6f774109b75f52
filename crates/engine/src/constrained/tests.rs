//! Constrained answers: documents valid for their schemas (checked by a
//! small JSON Schema validator below), deterministic per seed, refusals
//! with reasons, and the tokens a sequence emits for them.

use serde_json::{json, Value};

use super::*;

/// Checks `value` against `schema` (the subset the generator follows);
/// `Err` says where it fails.
fn validate(value: &Value, schema: &Value, root: &Value) -> Result<(), String> {
    let Some(map) = schema.as_object() else {
        return match schema {
            Value::Bool(true) => Ok(()),
            _ => Err(format!("{value} against {schema}")),
        };
    };
    let fail = |what: &str| Err(format!("{value}: {what} ({schema})"));
    if let Some(r) = map.get("$ref").and_then(Value::as_str) {
        let target = root
            .pointer(r.trim_start_matches('#'))
            .ok_or(format!("dangling {r}"))?;
        validate(value, target, root)?;
    }
    for all in map
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        validate(value, all, root)?;
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(list) = map.get(key).and_then(Value::as_array) {
            if !list.iter().any(|s| validate(value, s, root).is_ok()) {
                return fail(key);
            }
        }
    }
    if let Some(c) = map.get("const") {
        if c != value {
            return fail("const");
        }
    }
    if let Some(e) = map.get("enum").and_then(Value::as_array) {
        if !e.contains(value) {
            return fail("enum");
        }
    }
    if let Some(t) = map.get("type") {
        let types: Vec<&str> = match t {
            Value::Array(l) => l.iter().filter_map(Value::as_str).collect(),
            other => other.as_str().into_iter().collect(),
        };
        let ok = types.iter().any(|t| match *t {
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "string" => value.is_string(),
            "boolean" => value.is_boolean(),
            "null" => value.is_null(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            _ => false,
        });
        if !ok {
            return fail("type");
        }
    }
    let num = |k: &str| map.get(k).and_then(Value::as_f64);
    let len = |k: &str| map.get(k).and_then(Value::as_u64).map(|n| n as usize);
    if let Some(x) = value.as_f64() {
        let bad = num("minimum").is_some_and(|m| x < m)
            || num("maximum").is_some_and(|m| x > m)
            || num("exclusiveMinimum").is_some_and(|m| x <= m)
            || num("exclusiveMaximum").is_some_and(|m| x >= m)
            || num("multipleOf").is_some_and(|m| ((x / m).round() * m - x).abs() > 1e-9);
        if bad {
            return fail("bounds");
        }
    }
    if let Some(s) = value.as_str() {
        let chars = s.chars().count();
        if len("minLength").is_some_and(|m| chars < m)
            || len("maxLength").is_some_and(|m| chars > m)
        {
            return fail("length");
        }
        if let Some(p) = map.get("pattern").and_then(Value::as_str) {
            let re = regex::Regex::new(p).map_err(|e| e.to_string())?;
            if !re.is_match(s) {
                return fail("pattern");
            }
        }
    }
    if let Some(items) = value.as_array() {
        if len("minItems").is_some_and(|m| items.len() < m)
            || len("maxItems").is_some_and(|m| items.len() > m)
        {
            return fail("item count");
        }
        let prefix = map.get("prefixItems").and_then(Value::as_array);
        for (i, item) in items.iter().enumerate() {
            if let Some(s) = prefix.and_then(|p| p.get(i)).or(map.get("items")) {
                validate(item, s, root)?;
            }
        }
        if map.get("uniqueItems") == Some(&Value::Bool(true)) {
            for (i, a) in items.iter().enumerate() {
                if items[..i].contains(a) {
                    return fail("uniqueItems");
                }
            }
        }
    }
    if let Some(obj) = value.as_object() {
        let props = map.get("properties").and_then(Value::as_object);
        for name in map
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !obj.contains_key(name.as_str().unwrap_or_default()) {
                return fail("required");
            }
        }
        if len("minProperties").is_some_and(|m| obj.len() < m)
            || len("maxProperties").is_some_and(|m| obj.len() > m)
        {
            return fail("property count");
        }
        for (name, v) in obj {
            match props.and_then(|p| p.get(name)) {
                Some(s) => validate(v, s, root)?,
                None => match map.get("additionalProperties") {
                    Some(Value::Bool(false)) => return fail("additionalProperties"),
                    Some(s) => validate(v, s, root)?,
                    None => {}
                },
            }
        }
    }
    Ok(())
}

/// The documents drawn for `schema` with seeds `0..n`, each checked.
fn documents(schema: &Value, n: u64) -> Vec<Value> {
    let guide = SchemaGuide::compile(&schema.to_string()).unwrap_or_else(|e| panic!("{e}"));
    (0..n)
        .map(|seed| {
            let text = guide
                .generate(&mut Rng::seeded(seed), MAX_ANSWER_BYTES)
                .unwrap_or_else(|e| panic!("{schema}: {e}"));
            let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            if let Err(e) = validate(&doc, schema, schema) {
                panic!("{text} is not valid: {e}");
            }
            doc
        })
        .collect()
}

/// What the openai client's `parse` sends for a pydantic model with a
/// nested model, a list, an enum, an int, a bool and an optional field.
fn pydantic_schema() -> Value {
    json!({
        "$defs": {
            "Address": {
                "properties": {
                    "city": {"title": "City", "type": "string"},
                    "zip": {"title": "Zip", "type": "integer", "minimum": 1000, "maximum": 99999}
                },
                "required": ["city", "zip"], "title": "Address", "type": "object",
                "additionalProperties": false
            },
            "Color": {"enum": ["red", "green", "blue"], "title": "Color", "type": "string"}
        },
        "properties": {
            "name": {"title": "Name", "type": "string", "minLength": 2, "maxLength": 20},
            "age": {"title": "Age", "type": "integer"},
            "member": {"title": "Member", "type": "boolean"},
            "color": {"$ref": "#/$defs/Color"},
            "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"},
            "home": {"$ref": "#/$defs/Address"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Note"},
            "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
        },
        "required": ["name", "age", "member", "color", "tags", "home", "note", "score"],
        "title": "Person", "type": "object", "additionalProperties": false
    })
}

#[test]
fn pydantic_documents_validate_and_vary_by_seed() {
    let schema = pydantic_schema();
    let docs = documents(&schema, 30);
    assert_eq!(docs, documents(&schema, 30), "same seed, same document");
    let distinct: std::collections::HashSet<String> = docs.iter().map(Value::to_string).collect();
    assert!(distinct.len() > 20, "{distinct:?}");
    // Properties come in schema order.
    let text = docs[0].to_string();
    assert!(text.find("\"name\"") < text.find("\"home\""), "{text}");
}

#[test]
fn keyword_coverage() {
    let schemas = [
        json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5, "multipleOf": 2},
               "minItems": 2, "maxItems": 4, "uniqueItems": true}),
        json!({"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"}),
        json!({"type": "string", "minLength": 30}),
        json!({"type": ["integer", "null"], "exclusiveMaximum": 3, "exclusiveMinimum": 1}),
        json!({"type": "number", "minimum": 2.5, "maximum": 2.5}),
        json!({"type": "number", "multipleOf": 0.25, "minimum": 1, "maximum": 2}),
        json!({"const": {"fixed": [1, 2]}}),
        json!({"enum": ["a", 1, null], "type": "string"}),
        json!({"prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": false, "minItems": 2}),
        json!({"type": "object", "required": ["x", "y"], "additionalProperties": {"type": "integer"}}),
        json!({"type": "object", "properties": {"a": {"type": "null"}}, "minProperties": 3}),
        json!({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"b": {"type": "string"}}, "required": ["b"]},
                         {"properties": {"a": {"minimum": 50}}}]}),
        json!({"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"],
               "oneOf": [{"properties": {"kind": {"const": "cat"}}}, {"properties": {"kind": {"const": "dog"}}}]}),
        json!({"$ref": "#/definitions/Item", "definitions": {"Item": {"type": "object",
               "properties": {"id": {"type": "integer"}}, "required": ["id"]}}}),
        json!({"type": "string", "format": "date-time"}),
        json!({"type": "string", "format": "uuid"}),
        json!({}),
        json!(true),
    ];
    for schema in schemas {
        documents(&schema, 12);
    }
}

#[test]
fn open_objects_get_properties() {
    let docs = documents(&json!({"type": "object"}), 10);
    assert!(
        docs.iter()
            .all(|d| d.as_object().is_some_and(|o| !o.is_empty())),
        "{docs:?}"
    );
    let capped = documents(&json!({"type": "object", "maxProperties": 1}), 10);
    assert!(
        capped
            .iter()
            .all(|d| d.as_object().is_some_and(|o| o.len() == 1)),
        "{capped:?}"
    );
}

#[test]
fn recursive_schemas_end() {
    let tree = json!({
        "$defs": {"Node": {"type": "object", "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
        }, "required": ["value", "children"]}},
        "$ref": "#/$defs/Node"
    });
    documents(&tree, 20);
    let list = json!({"$defs": {"L": {"anyOf": [{"type": "null"},
        {"type": "object", "properties": {"next": {"$ref": "#/$defs/L"}}, "required": ["next"]}]}},
        "$ref": "#/$defs/L"});
    documents(&list, 20);
}

#[test]
fn unsatisfiable_schemas_are_refused_with_the_reason() {
    let cases = [
        (
            json!({"type": "array", "minItems": 3, "maxItems": 1}),
            "at least 3 items",
        ),
        (
            json!({"type": "integer", "minimum": 5, "maximum": 4}),
            "no integer",
        ),
        (
            json!({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1}),
            "no number",
        ),
        (
            json!({"type": "string", "minLength": 4, "maxLength": 2}),
            "at least 4 characters",
        ),
        (
            json!({"type": "object", "required": ["a"], "additionalProperties": false}),
            "`a` is required",
        ),
        (
            json!({"type": "object", "properties": {"a": false}, "required": ["a"]}),
            "`false` schema",
        ),
        (json!({"not": {"type": "string"}}), "`not` is not supported"),
        (
            json!({"$ref": "https://example.com/s.json"}),
            "only references inside",
        ),
        (json!({"$ref": "#/$defs/Missing"}), "points at nothing"),
        (json!({"type": "banana"}), "unknown type"),
        (json!({"enum": [1, 2], "type": "string"}), "no `enum` value"),
        (
            json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
            "no common type",
        ),
        (
            json!({"type": "string", "pattern": "(("}),
            "invalid regular expression",
        ),
    ];
    for (schema, reason) in cases {
        let err = SchemaGuide::compile(&schema.to_string())
            .err()
            .unwrap_or_default();
        assert!(err.contains(reason), "{schema}: {err:?}");
    }
    assert!(SchemaGuide::compile("{not json").is_err());
    // Compiles, but every document would be too large or too deep.
    let huge = SchemaGuide::compile(&json!({"type": "string", "minLength": 1_000_000}).to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    let err = huge
        .generate(&mut Rng::seeded(0), MAX_ANSWER_BYTES)
        .err()
        .unwrap_or_default();
    assert!(err.contains("larger than"), "{err}");
    let deep = json!({"$defs": {"D": {"type": "object", "properties": {"d": {"$ref": "#/$defs/D"}},
        "required": ["d"]}}, "$ref": "#/$defs/D"});
    let guide = SchemaGuide::compile(&deep.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let err = guide
        .generate(&mut Rng::seeded(0), MAX_ANSWER_BYTES)
        .err()
        .unwrap_or_default();
    assert!(err.contains("deeper than"), "{err}");
}

#[test]
fn ebnf_and_structural_tags_are_unimplemented() {
    for c in [
        Constraint::EbnfGrammar("root ::= \"a\"".into()),
        Constraint::StructuralTag("{}".into()),
    ] {
        let status = check(Some(&c)).err().map(|s| s.code());
        assert_eq!(status, Some(tonic::Code::Unimplemented), "{c:?}");
    }
    assert!(check(Some(&Constraint::Regex("a".into()))).is_ok());
    assert!(check(None).is_ok());
}

fn tiny_encoder() -> (TextEncoder, tokenizers::Tokenizer) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    iris_model::tiny::write_tiny_qwen2_vl(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let tokenizer = iris_model::ModelDir::load(dir.path())
        .and_then(|d| d.load_tokenizer())
        .unwrap_or_else(|e| panic!("{e}"));
    (TextEncoder::new(tokenizer.clone()), tokenizer)
}

fn params(max_new_tokens: u32, seed: u64) -> SequenceParams {
    SequenceParams {
        max_new_tokens,
        min_new_tokens: 0,
        stop_token_ids: vec![],
        ignore_eos: false,
        seed,
        index: 0,
        logit_bias: vec![],
        top_logprobs: None,
    }
}

fn vocab() -> Vocab {
    Vocab {
        ordinary: (0..640).collect(),
        eos: vec![642],
        eos_ppm: 0,
    }
}

/// Runs the sequences of a constrained request: its steps per sequence.
fn run(constraint: &Constraint, sequences: &[SequenceParams]) -> Vec<Vec<Step>> {
    let (encoder, _) = tiny_encoder();
    let state = PromptState::prefill(&[1, 2, 3], []);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let scripts = runtime
        .block_on(scripts(Some(constraint), &encoder, &state, sequences, &[]))
        .unwrap_or_else(|e| panic!("{e}"));
    let vocab = vocab();
    sequences
        .iter()
        .zip(scripts)
        .map(|(p, script)| {
            let mut seq = crate::model::Sequence::new(&state, &vocab, p).follow(script);
            std::iter::from_fn(|| seq.step()).collect()
        })
        .collect()
}

#[test]
fn the_answer_is_emitted_token_by_token_then_eos() {
    let (_, tokenizer) = tiny_encoder();
    let schema = pydantic_schema();
    let constraint = Constraint::JsonSchema(schema.to_string());
    let runs = run(&constraint, &[params(2000, 1), params(2000, 2)]);
    let mut texts = Vec::new();
    for steps in runs {
        let last = steps.last().cloned();
        assert_eq!(last.and_then(|s| s.finish), Some(Finish::Stop(642)));
        let ids: Vec<u32> = steps[..steps.len() - 1].iter().map(|s| s.token).collect();
        assert!(steps[..steps.len() - 1].iter().all(|s| s.finish.is_none()));
        let text = tokenizer
            .decode(&ids, true)
            .unwrap_or_else(|e| panic!("{e}"));
        let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        validate(&doc, &schema, &schema).unwrap_or_else(|e| panic!("{e}"));
        texts.push(text);
    }
    assert_ne!(texts[0], texts[1], "another seed, another document");
    // max_new_tokens cuts the answer.
    let cut = run(&constraint, &[params(5, 1)]).remove(0);
    assert_eq!(cut.len(), 5);
    assert_eq!(cut[4].finish, Some(Finish::Length));
}

#[test]
fn regex_answers_match_and_special_token_text_stays_text() {
    let (_, tokenizer) = tiny_encoder();
    let pattern = r"<\|im_end\|>[a-z]{3} (ok|no)";
    let check = regex::Regex::new(&format!(r"\A(?:{pattern})\z")).unwrap_or_else(|e| panic!("{e}"));
    let steps = run(&Constraint::Regex(pattern.into()), &[params(100, 0)]).remove(0);
    let ids: Vec<u32> = steps[..steps.len() - 1].iter().map(|s| s.token).collect();
    assert!(ids.iter().all(|&id| id < 640), "{ids:?}");
    let text = tokenizer
        .decode(&ids, true)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(check.is_match(&text), "{text:?}");
}

#[test]
fn the_tiny_tokenizer_round_trips_printable_ascii() {
    let (encoder, tokenizer) = tiny_encoder();
    let text: String = (0x20u8..0x7f).map(char::from).collect::<String>() + "\n\t";
    let ids = encoder.encode(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        tokenizer.decode(&ids, true).ok().as_deref(),
        Some(text.as_str())
    );
}

#[test]
fn an_unsatisfiable_schema_fails_when_decoding_starts() {
    let (encoder, _) = tiny_encoder();
    let state = PromptState::prefill(&[1], []);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let bad =
        Constraint::JsonSchema(json!({"type": "array", "minItems": 2, "maxItems": 1}).to_string());
    let status = runtime
        .block_on(scripts(Some(&bad), &encoder, &state, &[params(10, 0)], &[]))
        .err();
    assert_eq!(
        status.as_ref().map(|s| s.code()),
        Some(tonic::Code::InvalidArgument)
    );
    let none = runtime
        .block_on(scripts(
            None,
            &encoder,
            &state,
            &[params(10, 0), params(10, 1)],
            &[],
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(none.len(), 2);
    assert!(none.iter().all(Option::is_none));
}

/// A request moved mid-stream with its constrained output so far at the
/// end of its input resumes the very answer an uninterrupted run writes;
/// output another engine wrote is refused.
#[test]
fn a_constraint_resumes_after_the_output_already_written() {
    let constraint = Constraint::JsonSchema(pydantic_schema().to_string());
    let whole: Vec<u32> = run(&constraint, &[params(400, 5)])[0]
        .iter()
        .map(|step| step.token)
        .collect();
    assert!(whole.len() > 6, "{whole:?}");
    let (encoder, _) = tiny_encoder();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut input = vec![1, 2, 3];
    input.extend_from_slice(&whole[..4]);
    let state = PromptState::prefill_resuming(&input, [], 4);
    assert_eq!(
        state.constraint_key(),
        &PromptState::prefill(&[1, 2, 3], []).digest
    );
    let written = &input[3..];
    let resumed = runtime
        .block_on(scripts(
            Some(&constraint),
            &encoder,
            &state,
            &[params(400, 5)],
            written,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    let vocab = vocab();
    let p = params(400, 5);
    let mut seq = crate::model::Sequence::new(&state, &vocab, &p)
        .follow(resumed.into_iter().next().flatten());
    let rest: Vec<u32> = std::iter::from_fn(|| seq.step()).map(|s| s.token).collect();
    assert_eq!(rest, whole[4..], "the rest of the same answer");

    let foreign = [whole[0] + 1];
    let refused = runtime
        .block_on(scripts(
            Some(&constraint),
            &encoder,
            &state,
            &[params(400, 5)],
            &foreign,
        ))
        .err();
    assert_eq!(
        refused.map(|s| s.code()),
        Some(tonic::Code::FailedPrecondition)
    );
}
