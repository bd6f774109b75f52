//! Model directories laid out like the real Qwen2-VL, Qwen2.5-VL and
//! Qwen3-VL ones (see `fixtures/README.md`).

use std::path::PathBuf;

use iris_model::chat_template::ChatTemplate;
use iris_model::{ModelDir, ModelError};
use serde_json::json;

fn fixture(name: &str) -> ModelDir {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    ModelDir::load(&path).unwrap()
}

#[test]
fn qwen2_vl_7b_instruct() {
    let m = fixture("Qwen2-VL-7B-Instruct");
    let c = &m.config;
    assert_eq!(c.model_type, "qwen2_vl");
    assert_eq!(c.architectures, ["Qwen2VLForConditionalGeneration"]);
    assert_eq!(c.image_token_id, Some(151655));
    assert_eq!(c.video_token_id, Some(151656));
    assert_eq!(c.vision_start_token_id, Some(151652));
    assert_eq!(c.vision_end_token_id, Some(151653));
    assert_eq!(c.bos_token_id, Some(151643));
    assert_eq!(c.max_context_length, Some(32768));
    assert_eq!(c.vocab_size, Some(152064));
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    let v = c.vision.unwrap();
    assert_eq!(
        (v.patch_size, v.spatial_merge_size, v.temporal_patch_size),
        (14, 2, 2)
    );
    assert_eq!(
        (v.depth, v.hidden_size, v.num_heads, v.in_channels),
        (32, 1280, 16, 3)
    );
    assert_eq!(
        v.out_hidden_size, 3584,
        "Qwen2-VL: vision hidden_size is the merger output"
    );
    assert_eq!(v.mlp_ratio_or_intermediate, Some(4));
    assert!(c.supports_vision());
    assert_eq!(m.eos_token_ids(), [151645, 151643]);
    let g = m.generation_config.as_ref().unwrap();
    assert_eq!(g.top_k, Some(1));
    assert_eq!(g.repetition_penalty, Some(1.05));
    assert_eq!(m.tokenizer_config.eos_token.as_deref(), Some("<|im_end|>"));
    assert_eq!(
        m.tokenizer_config.pad_token.as_deref(),
        Some("<|endoftext|>")
    );
    assert_eq!(m.tokenizer_config.bos_token, None);
    assert_eq!(m.preprocessor_config.as_ref().unwrap()["min_pixels"], 3136);
    assert_eq!(m.served_model_name(), "Qwen2-VL-7B-Instruct");
}

#[test]
fn qwen2_5_vl_7b_instruct() {
    let m = fixture("Qwen2.5-VL-7B-Instruct");
    let c = &m.config;
    assert_eq!(c.model_type, "qwen2_5_vl");
    assert_eq!(c.image_token_id, Some(151655));
    assert_eq!(c.vision_start_token_id, Some(151652));
    assert_eq!(c.max_context_length, Some(128000));
    let v = c.vision.unwrap();
    assert_eq!(
        (v.patch_size, v.spatial_merge_size, v.temporal_patch_size),
        (14, 2, 2)
    );
    assert_eq!(
        (v.depth, v.hidden_size, v.out_hidden_size),
        (32, 1280, 3584)
    );
    assert_eq!(v.mlp_ratio_or_intermediate, Some(3420));
    assert_eq!(m.eos_token_ids(), [151645, 151643]);
    assert_eq!(m.served_model_name(), "Qwen2.5-VL-7B-Instruct");
}

#[test]
fn qwen3_vl_8b_instruct_reads_text_config() {
    let m = fixture("Qwen3-VL-8B-Instruct");
    let c = &m.config;
    assert_eq!(c.model_type, "qwen3_vl");
    assert_eq!(c.architectures, ["Qwen3VLForConditionalGeneration"]);
    assert_eq!(c.image_token_id, Some(151655));
    assert_eq!(c.video_token_id, Some(151656));
    assert_eq!(c.vision_start_token_id, Some(151652));
    assert_eq!(c.vision_end_token_id, Some(151653));
    assert_eq!(c.max_context_length, Some(262144));
    assert_eq!(c.vocab_size, Some(151936));
    assert_eq!(c.eos_token_ids, [151645]);
    assert_eq!(c.bos_token_id, Some(151643));
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    let v = c.vision.unwrap();
    assert_eq!(
        (v.patch_size, v.spatial_merge_size, v.temporal_patch_size),
        (16, 2, 2)
    );
    assert_eq!(
        (v.depth, v.hidden_size, v.num_heads, v.out_hidden_size),
        (27, 1152, 16, 4096)
    );
    assert_eq!(m.eos_token_ids(), [151645, 151643]);
    let g = m.generation_config.as_ref().unwrap();
    assert_eq!(
        (g.top_k, g.top_p, g.temperature),
        (Some(20), Some(0.8), Some(0.7))
    );
    let p = m.preprocessor_config.as_ref().unwrap();
    assert_eq!(p["patch_size"], 16);
    assert_eq!(p["size"]["shortest_edge"], 65536);
    assert_eq!(m.tokenizer_config.chat_template, None);
    assert!(m.chat_template().unwrap().contains("[chat_template.json]"));
}

#[test]
fn chat_template_json_wins_over_tokenizer_config() {
    let m = fixture("Qwen2-VL-7B-Instruct");
    assert!(m
        .tokenizer_config
        .chat_template
        .as_deref()
        .unwrap()
        .contains("[tokenizer_config]"));
    assert!(m.chat_template().unwrap().contains("[chat_template.json]"));
    assert!(m
        .chat_template_path()
        .unwrap()
        .ends_with("chat_template.json"));
}

#[test]
fn fixture_templates_render_qwen_prompts() {
    for name in [
        "Qwen2-VL-7B-Instruct",
        "Qwen2.5-VL-7B-Instruct",
        "Qwen3-VL-8B-Instruct",
    ] {
        let m = fixture(name);
        let t = ChatTemplate::new(m.chat_template().unwrap()).unwrap();
        let messages = json!([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]);
        assert_eq!(
            t.render(&messages, true, None).unwrap(),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\
             <|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n<|im_start|>assistant\n",
            "{name}"
        );
    }
}

#[test]
fn fixtures_have_no_tokenizer() {
    let m = fixture("Qwen3-VL-8B-Instruct");
    assert!(matches!(
        m.load_tokenizer(),
        Err(ModelError::MissingFile { .. })
    ));
    let err = m.tokenizer_bundle().unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("missing"),
        "{err}"
    );
}
