//! Fuzz target: arbitrary bytes through the gateway's chat request path:
//! `iris_openai::parse_chat_request`, then (for accepted requests) the tiny
//! model's chat template and tokenizer, as the gateway's `build_prompt`
//! does. Any panic is a bug; a parse failure must be a 400, a template
//! refusal is fine (the gateway answers 400), tokenizing must succeed.
#![no_main]

use std::sync::OnceLock;

use iris_model::chat_template::ChatTemplate;
use iris_model::ModelDir;
use iris_openai::{parse_chat_request, template_messages};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use tokenizers::Tokenizer;

struct Prompt {
    template: ChatTemplate,
    tokenizer: Tokenizer,
    extra: Value,
}

/// The tiny model, written once into a temporary directory.
fn prompt() -> &'static Prompt {
    static PROMPT: OnceLock<Prompt> = OnceLock::new();
    PROMPT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("iris-fuzz-tiny-{}", std::process::id()));
        iris_model::tiny::write_tiny_qwen2_vl(&dir).expect("write the tiny model");
        let model = ModelDir::load(&dir).expect("load the tiny model");
        let template = ChatTemplate::new(model.chat_template().expect("tiny model has a template"))
            .expect("template compiles");
        let tokenizer = model.load_tokenizer().expect("tokenizer loads");
        let tc = &model.tokenizer_config;
        let extra = json!({
            "bos_token": tc.bos_token.clone().unwrap_or_default(),
            "eos_token": tc.eos_token.clone().unwrap_or_default(),
        });
        Prompt {
            template,
            tokenizer,
            extra,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let p = prompt();
    let request = match parse_chat_request(data) {
        Ok(request) => request,
        Err(e) => {
            assert_eq!(e.status, 400, "{e:?}");
            return;
        }
    };
    let Ok(text) = p
        .template
        .render(&template_messages(&request.messages), true, Some(&p.extra))
    else {
        return;
    };
    p.tokenizer
        .encode(text.as_str(), false)
        .expect("rendered prompts tokenize");
});
