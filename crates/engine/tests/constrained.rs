//! Constrained decoding over gRPC: real `iris-engine` processes answer a
//! `json_schema` constraint with a valid document and a `regex` with a
//! match, token by token, the same in aggregated and prefill/decode
//! modes; unsatisfiable constraints are INVALID_ARGUMENT and EBNF grammars
//! and structural tags UNIMPLEMENTED.

mod common;

use std::time::Duration;

use common::*;
use iris_proto::scheduler::sampling_params::Constraint;
use iris_proto::scheduler::GenerateRequest;
use serde_json::Value;
use tonic::Code;

/// EOS of the tiny model (`<|im_end|>`).
const EOS: u32 = 642;

fn constrained(id: &str, constraint: Constraint, seed: u64, stream: bool) -> GenerateRequest {
    let mut req = text_request(id, PROMPT.to_vec(), 500, stream);
    let params = req.sampling_params.get_or_insert_with(Default::default);
    params.ignore_eos = false;
    params.sampling_seed = Some(seed);
    params.constraint = Some(constraint);
    req
}

/// The answer's text (EOS left out).
fn text(model: &tempfile::TempDir, ids: &[u32]) -> String {
    let tokenizer = iris_model::ModelDir::load(model.path())
        .and_then(|d| d.load_tokenizer())
        .expect("tokenizer");
    tokenizer.decode(ids, true).expect("decode")
}

const SCHEMA: &str = r#"{"type":"object","properties":{
    "name":{"type":"string","maxLength":10},
    "count":{"type":"integer","minimum":1,"maximum":9},
    "ok":{"type":"boolean"},
    "tags":{"type":"array","items":{"enum":["a","b"]},"minItems":1,"maxItems":3}},
    "required":["name","count","ok","tags"],"additionalProperties":false}"#;

fn check_document(doc: &Value) {
    let count = doc["count"].as_i64().expect("count");
    assert!((1..=9).contains(&count), "{doc}");
    assert!(
        doc["name"]
            .as_str()
            .is_some_and(|s| s.chars().count() <= 10),
        "{doc}"
    );
    assert!(doc["ok"].is_boolean(), "{doc}");
    let tags = doc["tags"].as_array().expect("tags");
    assert!((1..=3).contains(&tags.len()), "{doc}");
    assert!(tags.iter().all(|t| t == "a" || t == "b"), "{doc}");
    assert_eq!(doc.as_object().map(|o| o.len()), Some(4), "{doc}");
}

#[tokio::test]
async fn json_schema_and_regex_answers_in_every_mode() {
    let model = tiny_model();
    let agg = EngineProcess::start(&model, "aggregated", &[]);
    let mut client = agg.client().await;
    let schema = Constraint::JsonSchema(SCHEMA.into());

    let streamed = generate(&mut client, constrained("s1", schema.clone(), 1, true)).await;
    assert!(streamed.status.is_none(), "{:?}", streamed.status);
    let complete = streamed.complete();
    assert_eq!(complete.finish_reason, "stop");
    assert_eq!(complete.output_ids.last(), Some(&EOS));
    assert_eq!(streamed.streamed_tokens(), complete.output_ids);
    assert!(streamed.chunks.iter().all(|c| c.token_ids.len() == 1));
    let ids = &complete.output_ids[..complete.output_ids.len() - 1];
    let first: Value = serde_json::from_str(&text(&model, ids)).expect("JSON");
    check_document(&first);

    let mut docs = vec![first];
    for seed in 2..6 {
        let out = generate(&mut client, constrained("s2", schema.clone(), seed, false)).await;
        let ids = &out.complete().output_ids;
        let doc: Value = serde_json::from_str(&text(&model, &ids[..ids.len() - 1])).expect("JSON");
        check_document(&doc);
        docs.push(doc);
    }
    docs.dedup();
    assert!(docs.len() > 2, "seeds give other documents: {docs:?}");

    let pattern = r"[a-z]{2,6}-\d{3}";
    let out = generate(
        &mut client,
        constrained("r1", Constraint::Regex(pattern.into()), 7, false),
    )
    .await;
    let ids = &out.complete().output_ids;
    let answer = text(&model, &ids[..ids.len() - 1]);
    let whole = regex::Regex::new(&format!(r"\A(?:{pattern})\z")).expect("regex");
    assert!(whole.is_match(&answer), "{answer:?}");

    // A short max_new_tokens cuts the document.
    let mut short = constrained("c1", schema.clone(), 1, false);
    short
        .sampling_params
        .as_mut()
        .expect("params")
        .max_new_tokens = Some(4);
    let out = generate(&mut client, short).await;
    assert_eq!(out.complete().finish_reason, "length");
    assert_eq!(out.complete().output_ids, complete.output_ids[..4]);

    // Prefill + decode answer what the aggregated worker answers.
    let prefill = EngineProcess::start(&model, "prefill", &[]);
    let decode = EngineProcess::start(&model, "decode", &[]);
    let data = prefill.data.expect("prefill data server");
    let mut leg = constrained("pd", schema, 1, true);
    leg.kv_bootstrap_info = Some(kv_info(data, 5));
    let (mut p, mut d) = (prefill.client().await, decode.client().await);
    let (dec, pre) = tokio::join!(generate(&mut d, leg.clone()), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        generate(&mut p, leg.clone()).await
    });
    assert!(pre.status.is_none(), "{:?}", pre.status);
    assert_eq!(dec.complete().output_ids, complete.output_ids);
}

#[tokio::test]
async fn refusals() {
    let model = tiny_model();
    let agg = EngineProcess::start(&model, "aggregated", &[]);
    let mut client = agg.client().await;
    let cases = [
        (
            Constraint::JsonSchema(r#"{"type":"integer","minimum":3,"maximum":1}"#.into()),
            Code::InvalidArgument,
            "json_schema: no integer between 3 and 1",
        ),
        (
            Constraint::JsonSchema("{oops".into()),
            Code::InvalidArgument,
            "json_schema: the schema is not valid JSON",
        ),
        (
            Constraint::Regex("a(".into()),
            Code::InvalidArgument,
            "regex: invalid regular expression",
        ),
        (
            Constraint::EbnfGrammar(r#"root ::= "a""#.into()),
            Code::Unimplemented,
            "does not follow EBNF grammars",
        ),
        (
            Constraint::StructuralTag("{}".into()),
            Code::Unimplemented,
            "does not follow structural tags",
        ),
    ];
    for (i, (constraint, code, needle)) in cases.into_iter().enumerate() {
        let out = generate(
            &mut client,
            constrained(&format!("x{i}"), constraint, 0, true),
        )
        .await;
        let status = out.status.unwrap_or_else(|| panic!("{needle}: no error"));
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(needle), "{status:?}");
        assert!(out.chunks.is_empty(), "no token before the refusal");
    }
    // A prefill refuses what it cannot follow too, before any work.
    let prefill = EngineProcess::start(&model, "prefill", &[]);
    let mut leg = constrained(
        "p1",
        Constraint::EbnfGrammar("root ::= \"a\"".into()),
        0,
        false,
    );
    leg.kv_bootstrap_info = Some(kv_info(prefill.data.expect("data"), 9));
    let out = generate(&mut prefill.client().await, leg).await;
    assert_eq!(out.status.map(|s| s.code()), Some(Code::Unimplemented));
}
