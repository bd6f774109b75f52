//! Bad input: every failure is an error naming the file and the problem.

use std::fs;
use std::path::Path;

use iris_model::{ModelDir, ModelError};

fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for (name, contents) in files {
        fs::write(tmp.path().join(name), contents).unwrap();
    }
    tmp
}

fn load_err(files: &[(&str, &str)]) -> String {
    let tmp = dir_with(files);
    ModelDir::load(tmp.path()).unwrap_err().to_string()
}

const MINIMAL: &str = r#"{"model_type": "qwen2"}"#;

#[test]
fn missing_directory() {
    let err = ModelDir::load(Path::new("/nonexistent/iris/model")).unwrap_err();
    assert!(matches!(err, ModelError::NotADirectory { .. }));
    assert!(err.to_string().contains("/nonexistent/iris/model"));
}

#[test]
fn a_file_is_not_a_directory() {
    let tmp = dir_with(&[("config.json", MINIMAL)]);
    let err = ModelDir::load(&tmp.path().join("config.json")).unwrap_err();
    assert!(matches!(err, ModelError::NotADirectory { .. }), "{err}");
}

#[test]
fn missing_config() {
    let tmp = dir_with(&[("tokenizer_config.json", "{}")]);
    let err = ModelDir::load(tmp.path()).unwrap_err();
    assert!(matches!(err, ModelError::MissingFile { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("config.json") && msg.contains("missing"),
        "{msg}"
    );
}

#[test]
fn minimal_config_loads() {
    let tmp = dir_with(&[("config.json", MINIMAL)]);
    let m = ModelDir::load(tmp.path()).unwrap();
    assert_eq!(m.config.model_type, "qwen2");
    assert!(!m.config.supports_vision());
    assert!(m.chat_template().is_none());
    assert!(m.generation_config.is_none());
    assert!(m.eos_token_ids().is_empty());
}

#[test]
fn invalid_json_names_file_and_position() {
    let err = load_err(&[("config.json", "{\"model_type\": \"qwen2\",\n  oops}")]);
    assert!(err.contains("config.json: invalid JSON"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    let err = load_err(&[("config.json", MINIMAL), ("generation_config.json", "")]);
    assert!(
        err.contains("generation_config.json: invalid JSON"),
        "{err}"
    );
}

#[test]
fn top_level_must_be_an_object() {
    let err = load_err(&[("config.json", "[1, 2]")]);
    assert!(
        err.contains("config.json") && err.contains("expected a JSON object, found a list"),
        "{err}"
    );
}

#[test]
fn missing_model_type() {
    let err = load_err(&[("config.json", "{}")]);
    assert!(
        err.contains("config.json: field `model_type`: missing"),
        "{err}"
    );
}

#[test]
fn wrong_field_types_name_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "config.json",
            r#"{"model_type": 7}"#,
            "field `model_type`: expected a string, found number 7",
        ),
        (
            "config.json",
            r#"{"model_type": "x", "image_token_id": "151655"}"#,
            "field `image_token_id`: expected a non-negative integer, found string \"151655\"",
        ),
        (
            "config.json",
            r#"{"model_type": "x", "eos_token_id": [1, -2]}"#,
            "field `eos_token_id`: expected a non-negative integer, found number -2",
        ),
        (
            "config.json",
            r#"{"model_type": "x", "max_position_embeddings": 1.5}"#,
            "field `max_position_embeddings`",
        ),
        (
            "config.json",
            r#"{"model_type": "x", "text_config": {"vocab_size": true}}"#,
            "field `text_config.vocab_size`: expected a non-negative integer, found boolean true",
        ),
        (
            "config.json",
            r#"{"model_type": "x", "text_config": 3}"#,
            "field `text_config`: expected an object",
        ),
        (
            "config.json",
            r#"{"model_type": "x", "vision_config": {"depth": 2, "num_heads": 2, "hidden_size": 8}}"#,
            "field `vision_config.patch_size`: missing",
        ),
        (
            "config.json",
            r#"{"model_type": "x", "vision_config": {"patch_size": 14, "depth": 2, "num_heads": 2, "hidden_size": 8, "spatial_merge_size": "2"}}"#,
            "field `vision_config.spatial_merge_size`",
        ),
        (
            "config.json",
            r#"{"model_type": "x", "architectures": "Qwen"}"#,
            "field `architectures`: expected a list of strings",
        ),
        (
            "config.json",
            r#"{"model_type": "x", "image_token_id": 99999999999}"#,
            "field `image_token_id`",
        ),
    ];
    for (file, contents, expected) in cases {
        let files = [(*file, *contents)];
        let err = load_err(&files);
        assert!(
            err.contains(file) && err.contains(expected),
            "{contents}\n -> {err}"
        );
    }
}

#[test]
fn wrong_types_in_optional_files() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "tokenizer_config.json",
            r#"{"eos_token": 5}"#,
            "tokenizer_config.json: field `eos_token`: expected a string or {\"content\": ...}",
        ),
        (
            "tokenizer_config.json",
            r#"{"eos_token": {"id": 5}}"#,
            "field `eos_token`: object without a string \"content\"",
        ),
        (
            "tokenizer_config.json",
            r#"{"add_bos_token": "yes"}"#,
            "field `add_bos_token`: expected true or false",
        ),
        (
            "tokenizer_config.json",
            r#"{"chat_template": 1}"#,
            "field `chat_template`",
        ),
        (
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "default"}]}"#,
            "field `chat_template`: list entries",
        ),
        (
            "generation_config.json",
            r#"{"temperature": "hot"}"#,
            "generation_config.json: field `temperature`: expected a number",
        ),
        (
            "generation_config.json",
            r#"{"top_k": 1.5}"#,
            "field `top_k`: expected an integer",
        ),
        (
            "generation_config.json",
            r#"{"eos_token_id": [1, "2"]}"#,
            "field `eos_token_id`",
        ),
        (
            "preprocessor_config.json",
            "[]",
            "preprocessor_config.json: field `(top level)`",
        ),
        (
            "chat_template.json",
            r#"{"chat_template": {"a": 1}}"#,
            "chat_template.json: field `chat_template`",
        ),
    ];
    for (file, contents, expected) in cases {
        let err = load_err(&[("config.json", MINIMAL), (file, contents)]);
        assert!(err.contains(expected), "{file}: {contents}\n -> {err}");
    }
}

#[test]
fn broken_tokenizer_json() {
    let tmp = dir_with(&[
        ("config.json", MINIMAL),
        ("tokenizer.json", r#"{"model": 1}"#),
    ]);
    let m = ModelDir::load(tmp.path()).unwrap();
    let err = m.load_tokenizer().unwrap_err();
    assert!(matches!(err, ModelError::Tokenizer { .. }));
    assert!(
        err.to_string()
            .contains("tokenizer.json: cannot load tokenizer"),
        "{err}"
    );
}

#[test]
fn token_and_template_variants() {
    let tmp = dir_with(&[
        (
            "config.json",
            r#"{"model_type": "x", "eos_token_id": [2, 3, 2], "image_token_index": 9, "vision_config": {"patch_size": 14, "num_hidden_layers": 4, "num_attention_heads": 2, "hidden_size": 8}, "text_config": {"hidden_size": 16, "eos_token_id": 4}}"#,
        ),
        (
            "tokenizer_config.json",
            r#"{"bos_token": {"content": "<s>", "lstrip": false}, "add_bos_token": true, "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
        ),
        (
            "generation_config.json",
            r#"{"eos_token_id": 3, "top_k": -1}"#,
        ),
    ]);
    let m = ModelDir::load(tmp.path()).unwrap();
    assert_eq!(m.config.eos_token_ids, [2, 3, 4]);
    assert_eq!(m.eos_token_ids(), [3, 2, 4]);
    assert_eq!(m.config.image_token_id, Some(9));
    let v = m.config.vision.unwrap();
    assert_eq!(
        (v.spatial_merge_size, v.temporal_patch_size, v.in_channels),
        (1, 1, 3)
    );
    assert_eq!((v.depth, v.num_heads, v.out_hidden_size), (4, 2, 16));
    assert_eq!(m.tokenizer_config.bos_token.as_deref(), Some("<s>"));
    assert!(m.tokenizer_config.add_bos_token);
    assert_eq!(m.chat_template(), Some("D"));
    assert_eq!(m.generation_config.unwrap().top_k, Some(-1));
}

/// Phi-4-multimodal's config.json keeps the image token in
/// `vision_config` (200010, `<|image|>`); a top-level one still wins.
#[test]
fn image_token_in_vision_config() {
    let vision = r#""vision_config": {"patch_size": 14, "num_hidden_layers": 27, "num_attention_heads": 16, "hidden_size": 1152, "image_token_id": 200010}"#;
    let phi4 = format!(r#"{{"model_type": "phi4_multimodal", "hidden_size": 3072, {vision}}}"#);
    let tmp = dir_with(&[("config.json", phi4.as_str())]);
    let m = ModelDir::load(tmp.path()).unwrap();
    assert_eq!(m.config.image_token_id, Some(200010));
    assert!(m.config.supports_vision());
    let top = format!(r#"{{"model_type": "x", "hidden_size": 8, "image_token_id": 7, {vision}}}"#);
    let tmp = dir_with(&[("config.json", top.as_str())]);
    assert_eq!(
        ModelDir::load(tmp.path()).unwrap().config.image_token_id,
        Some(7)
    );
}

#[test]
fn chat_template_jinja_file_wins() {
    let tmp = dir_with(&[
        ("config.json", MINIMAL),
        (
            "tokenizer_config.json",
            r#"{"chat_template": "from tokenizer_config"}"#,
        ),
        (
            "chat_template.json",
            r#"{"chat_template": "from chat_template.json"}"#,
        ),
        ("chat_template.jinja", "from chat_template.jinja"),
    ]);
    let m = ModelDir::load(tmp.path()).unwrap();
    assert_eq!(m.chat_template(), Some("from chat_template.jinja"));
    fs::remove_file(tmp.path().join("chat_template.jinja")).unwrap();
    let m = ModelDir::load(tmp.path()).unwrap();
    assert_eq!(m.chat_template(), Some("from chat_template.json"));
    fs::remove_file(tmp.path().join("chat_template.json")).unwrap();
    let m = ModelDir::load(tmp.path()).unwrap();
    assert_eq!(m.chat_template(), Some("from tokenizer_config"));
}

#[test]
fn bundle_requires_tokenizer_config() {
    let tmp = dir_with(&[("config.json", MINIMAL), ("tokenizer.json", "{}")]);
    let m = ModelDir::load(tmp.path()).unwrap();
    let err = m.tokenizer_bundle().unwrap_err().to_string();
    assert!(
        err.contains("tokenizer_config.json: required file is missing"),
        "{err}"
    );
}
