//! The tiny model: generation, loading, tokenizer, chat template, ordinary
//! ids and the tokenizer bundle.

mod common;

use std::fs;
use std::path::Path;

use iris_model::chat_template::ChatTemplate;
use iris_model::tiny::{self, *};
use iris_model::{ordinary_token_ids, sha256_hex, ModelDir};
use serde_json::json;

fn tiny_dir() -> (tempfile::TempDir, ModelDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-qwen2-vl");
    write_tiny_qwen2_vl(&dir).unwrap();
    let model = ModelDir::load(&dir).unwrap();
    (tmp, model)
}

fn read_all(dir: &Path) -> Vec<(String, Vec<u8>)> {
    tiny::FILES
        .iter()
        .map(|name| (name.to_string(), fs::read(dir.join(name)).unwrap()))
        .collect()
}

#[test]
fn generation_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    write_tiny_qwen2_vl(&a).unwrap();
    write_tiny_qwen2_vl(&b).unwrap();
    assert_eq!(read_all(&a), read_all(&b));
    let mut names: Vec<_> = fs::read_dir(&a)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, tiny::FILES);
}

#[test]
fn config_loads() {
    let (_tmp, model) = tiny_dir();
    let c = &model.config;
    assert_eq!(c.model_type, "qwen2_vl");
    assert_eq!(c.architectures, ["Qwen2VLForConditionalGeneration"]);
    assert_eq!(c.image_token_id, Some(IMAGE_PAD_ID));
    assert_eq!(c.video_token_id, Some(VIDEO_PAD_ID));
    assert_eq!(c.vision_start_token_id, Some(VISION_START_ID));
    assert_eq!(c.vision_end_token_id, Some(VISION_END_ID));
    assert_eq!(c.bos_token_id, Some(ENDOFTEXT_ID));
    assert_eq!(c.eos_token_ids, [IM_END_ID]);
    assert_eq!(c.max_context_length, Some(MAX_CONTEXT));
    assert_eq!(c.vocab_size, Some(VOCAB_SIZE));
    assert_eq!(c.torch_dtype.as_deref(), Some("float32"));
    assert!(c.supports_vision());
    let v = c.vision.unwrap();
    assert_eq!(
        (v.patch_size, v.spatial_merge_size, v.temporal_patch_size),
        (14, 2, 2)
    );
    assert_eq!(
        (v.depth, v.hidden_size, v.num_heads, v.in_channels),
        (2, 32, 2, 3)
    );
    assert_eq!(v.out_hidden_size, HIDDEN_SIZE);
    assert_eq!(v.mlp_ratio_or_intermediate, Some(2));
    assert_eq!(model.eos_token_ids(), [IM_END_ID, ENDOFTEXT_ID]);
    assert_eq!(model.served_model_name(), "tiny-qwen2-vl");
    assert_eq!(
        model.tokenizer_config.eos_token.as_deref(),
        Some("<|im_end|>")
    );
    assert_eq!(
        model.tokenizer_config.pad_token.as_deref(),
        Some("<|endoftext|>")
    );
    assert_eq!(model.tokenizer_config.bos_token, None);
    assert!(!model.tokenizer_config.add_bos_token);
    let g = model.generation_config.as_ref().unwrap();
    assert_eq!(g.eos_token_ids, [IM_END_ID, ENDOFTEXT_ID]);
    let p = model.preprocessor_config.as_ref().unwrap();
    assert_eq!(p["image_processor_type"], "Qwen2VLImageProcessor");
    assert_eq!(p["min_pixels"], 3136);
    assert_eq!(p["max_pixels"], 12845056);
    assert_eq!(p["image_mean"], json!([0.48145466, 0.4578275, 0.40821073]));
    assert_eq!(p["image_std"], json!([0.26862954, 0.26130258, 0.27577711]));
    assert_eq!(p["rescale_factor"].as_f64(), Some(1.0 / 255.0));
}

#[test]
fn tokenizer_round_trips_text() {
    let (_tmp, model) = tiny_dir();
    let tok = model.load_tokenizer().unwrap();
    assert_eq!(tok.get_vocab_size(true) as u32, VOCAB_SIZE);
    for text in [
        "Hello world, the quick brown fox jumps over 12 lazy dogs!",
        "  leading spaces\n\nand newlines\ttabs",
        "café, naïve, 日本語, emoji 🐈 — all bytes",
        "it's they'll we've I'd",
        "",
    ] {
        let enc = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
    }
    // Common words are single tokens, so generated text reads as words.
    let enc = tok.encode("the people", false).unwrap();
    assert_eq!(enc.get_tokens(), ["the", "Ġpeople"]);
}

#[test]
fn special_tokens_are_single_ids() {
    let (_tmp, model) = tiny_dir();
    let tok = model.load_tokenizer().unwrap();
    for (content, id) in SPECIAL_TOKENS {
        assert_eq!(tok.token_to_id(content), Some(id), "{content}");
        let enc = tok.encode(content, false).unwrap();
        assert_eq!(enc.get_ids(), [id], "{content}");
    }
    let enc = tok.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
    let ids = enc.get_ids();
    assert_eq!(ids.first(), Some(&IM_START_ID));
    assert_eq!(ids.last(), Some(&IM_END_ID));
    // Decoding with skip_special_tokens drops them.
    assert_eq!(tok.decode(ids, true).unwrap(), "user\nhi");
}

const CONVERSATION: &str = "<|im_start|>system\nYou are terse.<|im_end|>\n\
<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n\
<|im_start|>assistant\nA cat.<|im_end|>\n";

#[test]
fn chat_template_renders_conversation() {
    let (_tmp, model) = tiny_dir();
    let template = ChatTemplate::new(model.chat_template().unwrap()).unwrap();
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [
            {"type": "image", "image": "file:///cat.jpg"},
            {"type": "text", "text": "What is this?"}
        ]},
        {"role": "assistant", "content": "A cat."}
    ]);
    assert_eq!(
        template.render(&messages, false, None).unwrap(),
        CONVERSATION
    );
    let with_prompt = template.render(&messages, true, None).unwrap();
    assert_eq!(
        with_prompt,
        format!("{CONVERSATION}<|im_start|>assistant\n")
    );
}

#[test]
fn chat_template_default_system_and_parts() {
    let (_tmp, model) = tiny_dir();
    let template = ChatTemplate::new(model.chat_template().unwrap()).unwrap();
    let messages = json!([{"role": "user", "content": [
        {"type": "text", "text": "Compare "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": " and "},
        {"type": "video", "video": "clip.mp4"}
    ]}]);
    let out = template.render(&messages, true, None).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nCompare <|vision_start|><|image_pad|><|vision_end|> and \
         <|vision_start|><|video_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(out.contains(DEFAULT_SYSTEM_MESSAGE));
    assert_eq!(
        model.chat_template_path().unwrap().file_name().unwrap(),
        "tokenizer_config.json"
    );
}

#[test]
fn rendered_prompt_tokenizes_with_one_placeholder() {
    let (_tmp, model) = tiny_dir();
    let template = ChatTemplate::new(model.chat_template().unwrap()).unwrap();
    let tok = model.load_tokenizer().unwrap();
    let messages = json!([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}]);
    let prompt = template.render(&messages, true, None).unwrap();
    let ids = tok
        .encode(prompt.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    let count = |id| ids.iter().filter(|&&x| x == id).count();
    assert_eq!(count(IMAGE_PAD_ID), 1);
    assert_eq!(count(VISION_START_ID), 1);
    assert_eq!(count(IM_START_ID), 3);
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt);
}

#[test]
fn ordinary_ids_exclude_specials_and_decode_cleanly() {
    let (_tmp, model) = tiny_dir();
    let tok = model.load_tokenizer().unwrap();
    let ids = ordinary_token_ids(&tok);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "sorted");
    for (_, special) in SPECIAL_TOKENS {
        assert!(!ids.contains(&special));
    }
    assert!(ids.iter().all(|&id| id < ORDINARY_VOCAB_SIZE));
    for &id in &ids {
        let text = tok.decode(&[id], false).unwrap();
        assert!(
            !text.is_empty() && !text.chars().any(|c| c == '\u{FFFD}' || c.is_control()),
            "id {id}: {text:?}"
        );
    }
    // The 128 bytes >= 0x80 are partial UTF-8 on their own and the 33 ASCII
    // control bytes (0x00-0x1F, 0x7F) are not readable text; all else is
    // kept (95 printable ASCII bytes + every merged token, all ASCII).
    assert_eq!(ids.len() as u32, ORDINARY_VOCAB_SIZE - 128 - 33);
}

#[test]
fn bundle_zips_tokenizer_files() {
    let (_tmp, model) = tiny_dir();
    let bundle = model.tokenizer_bundle().unwrap();
    assert_eq!(bundle.sha256_hex, sha256_hex(&bundle.zip));
    assert_eq!(bundle.sha256_hex.len(), 64);
    let entries = common::read_stored_zip(&bundle.zip);
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "vocab.json",
            "merges.txt",
            "generation_config.json"
        ]
    );
    for e in &entries {
        assert_eq!(
            e.data,
            fs::read(model.root.join(&e.name)).unwrap(),
            "{}",
            e.name
        );
    }
    assert_eq!(model.tokenizer_bundle().unwrap(), bundle, "deterministic");
}

/// The tiny model's bytes are pinned: a change to the generator must be
/// deliberate (update this hash, and say so in docs/models.md if the token
/// ids move).
#[test]
fn bundle_hash_is_pinned() {
    let (_tmp, model) = tiny_dir();
    assert_eq!(
        model.tokenizer_bundle().unwrap().sha256_hex,
        "8048e4f9ed1afbcdc7049a7e575b36f49af8129618faf5053a7a106e7620a31a"
    );
}

#[test]
fn merges_and_vocab_files_agree_with_tokenizer_json() {
    let (_tmp, model) = tiny_dir();
    let vocab: serde_json::Value =
        serde_json::from_slice(&fs::read(model.root.join("vocab.json")).unwrap()).unwrap();
    let tokenizer: serde_json::Value =
        serde_json::from_slice(&fs::read(model.root.join("tokenizer.json")).unwrap()).unwrap();
    assert_eq!(vocab, tokenizer["model"]["vocab"]);
    assert_eq!(vocab.as_object().unwrap().len() as u32, ORDINARY_VOCAB_SIZE);
    let merges = fs::read_to_string(model.root.join("merges.txt")).unwrap();
    let lines: Vec<&str> = merges.lines().skip(1).collect();
    let json_merges: Vec<&str> = tokenizer["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(lines, json_merges);
}
