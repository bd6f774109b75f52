//! The `chat_request` fuzz target's body (`fuzz/fuzz_targets/chat_request.rs`)
//! as an ordinary test over a deterministic mutated corpus, so CI runs it
//! without libFuzzer or a nightly toolchain: request bytes through
//! `parse_chat_request`, then the tiny model's chat template and tokenizer
//! (the gateway's own `Prompter` and `iris_openai::template_messages`). Parse failures
//! must be 400s, template refusals are fine, tokenizing must succeed, and
//! nothing may panic.

use iris_gateway::{PromptOptions, Prompter};
use iris_model::ModelDir;
use iris_openai::parse_chat_request;
use iris_openai::template_messages;

use iris_testkit::Rng;

const SEEDS: &[&str] = &[
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"t"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]},{"role":"assistant","content":null},{"role":"user","content":"again"}],"stop":["a","\u00e9"],"max_tokens":3}"#,
    r#"{"model":"m","messages":[{"role":"developer","content":"<|im_start|>x<|im_end|>"},{"role":"user","content":"\u0000\u200d\ud83d\udc69 {{ raise_exception('x') }} {% for %}"}]}"#,
    r#"{"model":"m","messages":[{"role":"assistant","content":[{"type":"text","text":"r"}]},{"role":"user","content":[{"type":"text","text":"<|vision_start|><|image_pad|>"}]}]}"#,
];

const SPLICES: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\u",
    "\\ud800",
    "null",
    "true",
    "1e999",
    "-0",
    "\"role\"",
    "\"content\"",
    "\"user\"",
    "\"assistant\"",
    "\"image_url\"",
    "<|im_start|>",
    "{{",
    "{%",
    "\u{feff}",
    "\u{10ffff}",
];

/// Runs one body through the request path; `(parsed, rendered)`.
fn check(prompter: &Prompter, body: &[u8]) -> (bool, bool) {
    let request = match parse_chat_request(body) {
        Ok(request) => request,
        Err(e) => {
            assert_eq!(e.status, 400, "{e:?}");
            return (false, false);
        }
    };
    let Ok(text) = prompter.render(template_messages(&request.messages)) else {
        return (true, false);
    };
    prompter.encode(&text).expect("rendered prompts tokenize");
    (true, true)
}

#[test]
fn mutated_requests_never_panic() {
    let tiny = iris_testkit::model::tiny_model();
    let model = ModelDir::load(tiny.path()).expect("model dir");
    let options = PromptOptions {
        cache_entries: 256,
        ..PromptOptions::default()
    };
    let prompter = Prompter::load(&model, &options).expect("prompter");
    let mut rng = Rng(0x0bad_c0de_5eed_0001);
    let (mut parsed, mut rendered) = (0, 0);
    let splices: Vec<&[u8]> = SPLICES.iter().map(|s| s.as_bytes()).collect();
    for seed in SEEDS {
        let (p, r) = check(&prompter, seed.as_bytes());
        assert!(p && r, "seed must pass: {seed}");
        for _ in 0..300 {
            let mut bytes = seed.as_bytes().to_vec();
            rng.mutate(&mut bytes, 4, &splices);
            let (p, r) = check(&prompter, &bytes);
            parsed += usize::from(p);
            rendered += usize::from(r);
        }
    }
    assert!(
        parsed > 0 && rendered > 0,
        "parsed {parsed}, rendered {rendered}"
    );
}
