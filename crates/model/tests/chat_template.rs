//! Chat template rendering: parity with Python Jinja2 as `transformers`
//! configures it (`fixtures/chat/cases.json`), and error reporting.

use std::fs;
use std::path::PathBuf;

use iris_model::chat_template::ChatTemplate;
use serde_json::{json, Value};

fn chat_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

#[test]
fn renders_match_python_jinja2() {
    let cases: Value =
        serde_json::from_slice(&fs::read(chat_dir().join("cases.json")).unwrap()).unwrap();
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 7);
    for (i, case) in cases.iter().enumerate() {
        let name = case["template"].as_str().unwrap();
        let source = fs::read_to_string(chat_dir().join(name)).unwrap();
        let template = ChatTemplate::new(&source).unwrap();
        let mut extra = case["context"].clone();
        let ctx = extra.as_object_mut().unwrap();
        let messages = ctx.remove("messages").unwrap();
        let add = ctx
            .remove("add_generation_prompt")
            .unwrap()
            .as_bool()
            .unwrap();
        let result = template.render(&messages, add, Some(&extra));
        match (&case["expected"], &case["error"]) {
            (Value::String(expected), _) => {
                assert_eq!(&result.unwrap(), expected, "case {i} ({name})")
            }
            (_, Value::String(error)) => {
                let got = result.unwrap_err().to_string();
                assert!(
                    got.contains(error.as_str()),
                    "case {i}: {got:?} should contain {error:?}"
                );
            }
            _ => panic!("case {i} has neither expected nor error"),
        }
    }
}

#[test]
fn compiled_template_renders_many_times() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ m.content }};{% endfor %}{{ add_generation_prompt }}",
    )
    .unwrap();
    for n in 0..20 {
        let messages: Vec<Value> = (0..n)
            .map(|i| json!({"role": "user", "content": i}))
            .collect();
        let out = t.render(&Value::Array(messages), n % 2 == 0, None).unwrap();
        assert_eq!(out.matches(';').count(), n);
    }
}

#[test]
fn syntax_error_is_reported_with_line() {
    let err = ChatTemplate::new("line one\n{% for x in %}")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("chat template:"), "{err}");
    assert!(err.contains("chat_template:2"), "{err}");
}

#[test]
fn raise_exception_becomes_an_error() {
    let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}").unwrap();
    let err = t.render(&json!([]), false, None).unwrap_err().to_string();
    assert!(err.contains("roles must alternate"), "{err}");
}

#[test]
fn extra_must_be_an_object() {
    let t = ChatTemplate::new("x").unwrap();
    let err = t
        .render(&json!([]), false, Some(&json!([1])))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("extra variables must be a JSON object"),
        "{err}"
    );
}

#[test]
fn python_string_and_dict_methods() {
    let t = ChatTemplate::new(
        "{{ s.strip() }}|{{ s.lstrip().startswith('a') }}|{{ s.split(',') | length }}|\
         {% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}|{{ d.get('z', 'none') }}|{{ s.upper().endswith('C ') }}",
    )
    .unwrap();
    let out = t
        .render(
            &json!([]),
            false,
            Some(&json!({"s": "  a,b,c ", "d": {"y": 2, "x": 1}})),
        )
        .unwrap();
    // Booleans print as Python prints them, like Jinja2.
    assert_eq!(out, "a,b,c|True|3|y2x1|none|True");
}
