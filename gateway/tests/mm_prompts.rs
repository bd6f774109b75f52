//! Prompts with images, exact to Hugging Face: for each vision-language
//! family whose placeholders need more than the image token repeated, the
//! token ids a gateway sends its worker for a multi-image, multi-turn chat
//! equal those of the family's own processor class (transformers 4.57.1)
//! — `processor(text=processor.apply_chat_template(messages), images=…)
//! ["input_ids"]` — run by `hf_processor_reference.py` beside this file.
//!
//! Each family gets a model directory of its own: the tiny model's
//! byte-level BPE with one merge added (`\n\n`, so that blank lines
//! written next to message text tokenize differently from blank lines
//! tokenized apart, as in the real vocabularies) and the family's special
//! tokens; its real chat template (tests/data/templates, sources in
//! tests/data/README.md); its preprocessor and processor configs as the
//! public checkpoints ship them. A gateway serves the directory in front
//! of a stub worker that keeps the Generate requests it receives.
//!
//! The interpreter is `$IRIS_HF_PYTHON` (CI: `.venv-hf/bin/python`, made
//! by .ci/run from .ci/hf-reference/requirements.txt; default `python3`).
//! transformers' pins clash with the main venv's (tokenizers, hub), hence
//! its own venv. Without transformers 4.57.1 these tests FAIL with an
//! install hint, they never skip.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use base64::Engine as _;
use iris_proto::scheduler::GenerateRequest;
use iris_testkit::grpc::{Received, StubScheduler};
use serde_json::{json, Value};

use common::{post_json, ready};

/// The ordinary tokens of the tiny BPE, then `ĊĊ` (the added merge).
const NEWLINES_ID: u32 = iris_model::tiny::ORDINARY_VOCAB_SIZE;

/// One family's model directory and conversations.
struct Family {
    /// The chat template's file, from the gateway crate (a `.json` one
    /// holds it in its `chat_template` field).
    template: &'static str,
    /// Special tokens, in id order after [`NEWLINES_ID`].
    specials: Vec<String>,
    /// The special token the template writes as `bos_token` / `eos_token`.
    bos: &'static str,
    eos: &'static str,
    /// The image token (`image_token_id` / `image_token_index`).
    image_token: &'static str,
    preprocessor: Value,
    /// `processor_config.json`: the model processor's placeholder counts.
    processor_config: Value,
    /// The transformers processor class and its keyword arguments.
    processor_class: &'static str,
    processor_kwargs: Value,
    /// The tokenizer class the processor takes, and extra arguments
    /// (Gemma 3's named tokens).
    tokenizer_class: &'static str,
    tokenizer_kwargs: Value,
    /// Per-call processor arguments.
    call_kwargs: Value,
    /// Conversations in the OpenAI format; each `"IMAGE"` URL takes the
    /// next of `image_sizes` (width, height).
    conversations: Vec<(Value, Vec<(u32, u32)>)>,
}

/// A user turn of text and images, a model answer and a last user turn
/// starting with an image (Gemma 3's blank lines then meet the turn's);
/// and a turn whose images stand between texts.
fn conversations(
    parts: fn(Vec<Value>) -> Value,
    first: &[(u32, u32)],
    second: &[(u32, u32)],
) -> Vec<(Value, Vec<(u32, u32)>)> {
    let text = |t: &str| json!({"type": "text", "text": t});
    let image = || json!({"type": "image_url", "image_url": {"url": "IMAGE"}});
    let multi_turn = json!([
        {"role": "user", "content": parts(vec![text("Compare these two pictures:"), image(), image()])},
        {"role": "assistant", "content": "The first is darker.\n\nThe second is wider."},
        {"role": "user", "content": parts(vec![image(), text("And this one?")])},
    ]);
    let interleaved = json!([
        {"role": "user", "content": parts(vec![
            text("Left:\n"), image(), text("\nright:"), image(), text("Which is larger?"),
        ])},
    ]);
    vec![(multi_turn, first.to_vec()), (interleaved, second.to_vec())]
}

fn as_array(parts: Vec<Value>) -> Value {
    Value::Array(parts)
}

/// [`conversations`] with the assistant's answer as parts, for templates
/// that read every message's content as a list (SmolVLM's, LLaVA's).
fn answer_as_parts(first: &[(u32, u32)], second: &[(u32, u32)]) -> Vec<(Value, Vec<(u32, u32)>)> {
    let mut all = conversations(as_array, first, second);
    let answer = all[0].0[1]["content"].clone();
    all[0].0[1]["content"] = json!([{"type": "text", "text": answer}]);
    all
}

fn smolvlm_conversations() -> Vec<(Value, Vec<(u32, u32)>)> {
    answer_as_parts(
        &[(800, 600), (200, 150), (500, 900)],
        &[(1000, 400), (384, 384)],
    )
}

fn gemma3(pan_and_scan: bool) -> Family {
    let mut preprocessor = json!({
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null,
        "do_rescale": true, "do_resize": true,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": 256,
        "pan_and_scan_max_num_crops": null, "pan_and_scan_min_crop_size": null,
        "pan_and_scan_min_ratio_to_activate": null,
        "resample": 2, "rescale_factor": 0.00392156862745098,
        "size": {"height": 896, "width": 896},
    });
    let mut call_kwargs = json!({});
    if pan_and_scan {
        // On in the config, as Iris reads it; Gemma3Processor's call turns
        // it off unless asked, so the reference asks.
        preprocessor["do_pan_and_scan"] = json!(true);
        call_kwargs = json!({"do_pan_and_scan": true});
    }
    let specials = [
        "<bos>",
        "<eos>",
        "<start_of_turn>",
        "<end_of_turn>",
        "<start_of_image>",
        "<end_of_image>",
        "<image_soft_token>",
    ];
    Family {
        template: "tests/data/templates/gemma3.jinja",
        tokenizer_class: "PreTrainedTokenizerFast",
        specials: specials.iter().map(|s| s.to_string()).collect(),
        bos: "<bos>",
        eos: "<eos>",
        image_token: "<image_soft_token>",
        preprocessor,
        processor_config: json!({"image_seq_length": 256, "processor_class": "Gemma3Processor"}),
        processor_class: "Gemma3Processor",
        processor_kwargs: json!({"image_seq_length": 256}),
        tokenizer_kwargs: json!({"extra_special_tokens": {
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        }}),
        call_kwargs,
        conversations: conversations(
            as_array,
            &[(640, 480), (1000, 300), (400, 700)],
            &[(300, 1000), (512, 512)],
        ),
    }
}

fn smolvlm() -> Family {
    let mut specials: Vec<String> = [
        "<|im_start|>",
        "<end_of_utterance>",
        "<fake_token_around_image>",
        "<image>",
        "<global-img>",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for row in 1..=6 {
        specials.extend((1..=6).map(|col| format!("<row_{row}_col_{col}>")));
    }
    Family {
        template: "tests/data/templates/smolvlm.jinja",
        tokenizer_class: "PreTrainedTokenizerFast",
        specials,
        bos: "<|im_start|>",
        eos: "<end_of_utterance>",
        image_token: "<image>",
        preprocessor: json!({
            "image_processor_type": "Idefics3ImageProcessor",
            "processor_class": "Idefics3Processor",
            "do_convert_rgb": true, "do_image_splitting": true, "do_normalize": true,
            "do_pad": true, "do_rescale": true, "do_resize": true,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "max_image_size": {"longest_edge": 384},
            "resample": 1, "rescale_factor": 0.00392156862745098,
            "size": {"longest_edge": 1536},
        }),
        processor_config: json!({"image_seq_len": 81, "processor_class": "Idefics3Processor"}),
        processor_class: "Idefics3Processor",
        processor_kwargs: json!({"image_seq_len": 81}),
        tokenizer_kwargs: json!({}),
        call_kwargs: json!({}),
        conversations: smolvlm_conversations(),
    }
}

fn pixtral() -> Family {
    let specials = [
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[IMG]",
        "[IMG_BREAK]",
        "[IMG_END]",
    ];
    Family {
        template: "tests/data/templates/pixtral.jinja",
        tokenizer_class: "PreTrainedTokenizerFast",
        specials: specials.iter().map(|s| s.to_string()).collect(),
        bos: "<s>",
        eos: "</s>",
        image_token: "[IMG]",
        preprocessor: json!({
            "image_processor_type": "PixtralImageProcessor",
            "processor_class": "PixtralProcessor",
            "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "patch_size": {"height": 16, "width": 16},
            "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"longest_edge": 1024},
        }),
        processor_config: json!({
            "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]",
            "image_token": "[IMG]", "patch_size": 16, "processor_class": "PixtralProcessor",
        }),
        processor_class: "PixtralProcessor",
        processor_kwargs: json!({"patch_size": 16, "spatial_merge_size": 1}),
        tokenizer_kwargs: json!({}),
        call_kwargs: json!({"return_tensors": "np"}),
        conversations: conversations(
            as_array,
            &[(640, 480), (100, 50), (700, 300)],
            &[(1300, 700), (33, 47)],
        ),
    }
}

/// LLaVA-1.5 (`clip`) or, with `anyres`, LLaVA-NeXT: the image token
/// repeated, 576 times or once per feature of the image's tiles.
fn llava(anyres: bool) -> Family {
    let clip = json!({
        "image_processor_type": "CLIPImageProcessor",
        "crop_size": {"height": 336, "width": 336}, "do_center_crop": true,
        "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "resample": 3, "rescale_factor": 0.00392156862745098,
        "size": {"shortest_edge": 336},
    });
    let mut preprocessor = clip;
    let mut processor_class = "LlavaProcessor";
    if anyres {
        processor_class = "LlavaNextProcessor";
        preprocessor["image_processor_type"] = json!("LlavaNextImageProcessor");
        preprocessor["do_pad"] = json!(true);
        preprocessor["image_grid_pinpoints"] =
            json!([[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]);
    }
    let kwargs = json!({
        "patch_size": 14, "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
    });
    Family {
        template: "tests/data/templates/llava.jinja",
        tokenizer_class: "PreTrainedTokenizerFast",
        specials: ["<s>", "</s>", "<image>"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        bos: "<s>",
        eos: "</s>",
        image_token: "<image>",
        preprocessor,
        processor_config: kwargs.clone(),
        processor_class,
        processor_kwargs: kwargs,
        tokenizer_kwargs: json!({}),
        call_kwargs: json!({}),
        conversations: answer_as_parts(
            &[(640, 480), (100, 50), (900, 200)],
            &[(1300, 700), (336, 336)],
        ),
    }
}

/// Qwen2-VL-7B-Instruct's own chat template and image processor config
/// (crates/model/tests/fixtures): `<|image_pad|>` repeated once per merged
/// patch.
fn qwen2_vl() -> Family {
    let fixture = "../crates/model/tests/fixtures/Qwen2-VL-7B-Instruct";
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let preprocessor = read_json(&manifest.join(fixture).join("preprocessor_config.json"));
    let specials = iris_model::tiny::SPECIAL_TOKENS.map(|(t, _)| t.to_owned());
    Family {
        template: "../crates/model/tests/fixtures/Qwen2-VL-7B-Instruct/chat_template.json",
        tokenizer_class: "Qwen2TokenizerFast",
        specials: specials.to_vec(),
        bos: "<|endoftext|>",
        eos: "<|im_end|>",
        image_token: "<|image_pad|>",
        preprocessor,
        processor_config: json!({"processor_class": "Qwen2VLProcessor"}),
        processor_class: "Qwen2VLProcessor",
        processor_kwargs: json!({}),
        tokenizer_kwargs: json!({}),
        call_kwargs: json!({}),
        conversations: conversations(
            as_array,
            &[(640, 480), (100, 50), (300, 900)],
            &[(1300, 700), (56, 56)],
        ),
    }
}

/// LLaVA-OneVision: `<image>` repeated once per feature of the image's
/// tiles (anyres_max_9), each image on its own (the flat call).
fn llava_onevision() -> Family {
    let kwargs = json!({
        "num_image_tokens": 729, "vision_aspect_ratio": "anyres_max_9",
        "vision_feature_select_strategy": "full",
    });
    let pinpoints: Vec<[u32; 2]> = (1..=6)
        .flat_map(|i| (1..=6).map(move |j| [i * 384, j * 384]))
        .collect();
    Family {
        template: "tests/data/templates/llava_onevision.jinja",
        tokenizer_class: "PreTrainedTokenizerFast",
        specials: ["<|im_start|>", "<|im_end|>", "<image>", "<video>"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        bos: "<|im_start|>",
        eos: "<|im_end|>",
        image_token: "<image>",
        preprocessor: json!({
            "image_processor_type": "LlavaOnevisionImageProcessor",
            "do_convert_rgb": true, "do_normalize": true, "do_pad": true,
            "do_rescale": true, "do_resize": true,
            "image_grid_pinpoints": pinpoints,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"height": 384, "width": 384},
        }),
        processor_config: kwargs.clone(),
        processor_class: "LlavaOnevisionProcessor",
        processor_kwargs: kwargs,
        tokenizer_kwargs: json!({}),
        call_kwargs: json!({}),
        conversations: answer_as_parts(
            &[(640, 480), (100, 50), (900, 200)],
            &[(1300, 700), (384, 384)],
        ),
    }
}

/// Writes the family's model directory into `dir`.
fn write_model(family: &Family, dir: &Path) {
    iris_model::tiny::write_tiny_qwen2_vl(dir).expect("tiny model");
    for stale in [
        "vocab.json",
        "merges.txt",
        "special_tokens_map.json",
        "generation_config.json",
    ] {
        std::fs::remove_file(dir.join(stale)).expect("remove a tiny model file");
    }
    let mut tokenizer = read_json(&dir.join("tokenizer.json"));
    tokenizer["model"]["vocab"]["ĊĊ"] = json!(NEWLINES_ID);
    if let Some(merges) = tokenizer["model"]["merges"].as_array_mut() {
        merges.insert(0, json!("Ċ Ċ"));
    }
    let added: Vec<Value> = family
        .specials
        .iter()
        .enumerate()
        .map(|(i, content)| {
            json!({"id": special_id(i), "content": content, "single_word": false,
                   "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    tokenizer["added_tokens"] = Value::Array(added);
    write_json(&dir.join("tokenizer.json"), &tokenizer);
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"bos_token": family.bos, "eos_token": family.eos,
                "model_max_length": 32768, "tokenizer_class": "PreTrainedTokenizerFast"}),
    );
    let mut config = read_json(&dir.join("config.json"));
    let object = config.as_object_mut().expect("config object");
    for qwen in [
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
        "vision_token_id",
    ] {
        object.remove(qwen);
    }
    let id = |token: &str| {
        family
            .specials
            .iter()
            .position(|s| s == token)
            .map(special_id)
    };
    config["image_token_id"] = json!(id(family.image_token).expect("image token"));
    config["bos_token_id"] = json!(id(family.bos));
    config["eos_token_id"] = json!(id(family.eos));
    config["vocab_size"] = json!(special_id(family.specials.len()));
    write_json(&dir.join("config.json"), &config);
    write_json(&dir.join("preprocessor_config.json"), &family.preprocessor);
    write_json(&dir.join("processor_config.json"), &family.processor_config);
    let template = Path::new(env!("CARGO_MANIFEST_DIR")).join(family.template);
    let source = match template.extension().and_then(|e| e.to_str()) {
        Some("json") => read_json(&template)["chat_template"]
            .as_str()
            .expect("a chat_template string")
            .to_owned(),
        _ => std::fs::read_to_string(&template).expect("read the template"),
    };
    std::fs::write(dir.join("chat_template.jinja"), source).expect("write the template");
}

fn special_id(index: usize) -> u32 {
    NEWLINES_ID + 1 + index as u32
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn write_json(path: &Path, value: &Value) {
    let text = serde_json::to_string_pretty(value).expect("JSON");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A PNG of `width`×`height` whose pixels depend on `seed`, written to
/// `path`; returns its bytes.
fn write_png(path: &Path, (width, height): (u32, u32), seed: u32) -> Vec<u8> {
    let image = image::RgbImage::from_fn(width, height, |x, y| {
        let v = (x * 7 + y * 13 + seed * 61) % 251;
        image::Rgb([v as u8, (v * 3 % 256) as u8, (255 - v) as u8])
    });
    let mut png = std::io::Cursor::new(Vec::new());
    image
        .write_to(&mut png, image::ImageFormat::Png)
        .expect("png");
    std::fs::write(path, png.get_ref()).expect("write png");
    png.into_inner()
}

/// One conversation with its images: the request's messages (data: URLs)
/// and Hugging Face's (`{"type": "image"}`), and the image files.
struct Prepared {
    request: Value,
    hf_messages: Value,
    images: Vec<String>,
}

fn prepare(messages: &Value, sizes: &[(u32, u32)], dir: &Path, tag: usize) -> Prepared {
    let (mut request, mut hf_messages) = (messages.clone(), messages.clone());
    let mut images = Vec::new();
    for (turn, message) in messages.as_array().expect("messages").iter().enumerate() {
        let Some(parts) = message["content"].as_array() else {
            continue;
        };
        for (p, part) in parts.iter().enumerate() {
            if part["type"] != "image_url" {
                continue;
            }
            let n = images.len();
            let path = dir.join(format!("image-{tag}-{n}.png"));
            let png = write_png(&path, sizes[n], (tag * 10 + n) as u32);
            let b64 = base64::engine::general_purpose::STANDARD.encode(png);
            request[turn]["content"][p]["image_url"]["url"] =
                json!(format!("data:image/png;base64,{b64}"));
            hf_messages[turn]["content"][p] = json!({"type": "image"});
            images.push(path.display().to_string());
        }
    }
    assert_eq!(images.len(), sizes.len(), "one size per image");
    Prepared {
        request,
        hf_messages,
        images,
    }
}

fn hf_python() -> String {
    std::env::var("IRIS_HF_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// The reference processor's token ids for each conversation.
fn reference(family: &Family, dir: &Path, prepared: &[Prepared]) -> Vec<Vec<u32>> {
    let mut tokenizer = family.tokenizer_kwargs.clone();
    tokenizer["bos_token"] = json!(family.bos);
    tokenizer["eos_token"] = json!(family.eos);
    let request = json!({
        "model_dir": dir,
        "processor_class": family.processor_class,
        "processor_kwargs": family.processor_kwargs,
        "tokenizer_class": family.tokenizer_class,
        "tokenizer": tokenizer,
        "call_kwargs": family.call_kwargs,
        "conversations": prepared.iter().map(|p| json!({
            "messages": p.hf_messages, "images": p.images,
        })).collect::<Vec<_>>(),
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_processor_reference.py");
    let mut child = Command::new(hf_python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {} (set IRIS_HF_PYTHON): {e}", hf_python()));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request.to_string().as_bytes())
        .expect("write the request");
    let out = child.wait_with_output().expect("reference output");
    assert!(
        out.status.success(),
        "the Hugging Face reference failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = serde_json::from_slice(&out.stdout).expect("reference JSON");
    answers
        .iter()
        .map(|a| {
            a["input_ids"]
                .as_array()
                .expect("input_ids")
                .iter()
                .map(|v| v.as_u64().expect("token id") as u32)
                .collect()
        })
        .collect()
}

/// A gateway serving `dir` in front of a stub worker that keeps what it
/// is sent.
async fn gateway(dir: &Path) -> (iris_gateway::RunningGateway, Received) {
    let (stub, received) = StubScheduler::healthy("recording worker").recording();
    // The pixels travel inside the Generate request: no size cap.
    let service = stub.service().max_decoding_message_size(usize::MAX);
    let addr =
        iris_testkit::grpc::serve(tonic::transport::Server::builder().add_service(service)).await;
    let argv = [
        "--port".to_owned(),
        "0".to_owned(),
        "--model-path".to_owned(),
        dir.display().to_string(),
        "--health-check-interval-secs".to_owned(),
        "0.2".to_owned(),
        "--worker-urls".to_owned(),
        format!("grpc://{addr}"),
    ];
    let serve: iris_gateway::ServeArgs = iris_testkit::args::parse(argv);
    let gw = iris_gateway::start(serve).await.expect("gateway starts");
    ready(&gw).await;
    (gw, received)
}

/// The request the gateway sent its worker for `body`.
async fn sent(
    gw: &iris_gateway::RunningGateway,
    received: &Received,
    body: Value,
) -> GenerateRequest {
    let before = received.lock().expect("lock").len();
    let (status, answer) = post_json(gw, &body).await;
    let kept = received.lock().expect("lock");
    match kept.get(before) {
        Some(request) => request.clone(),
        None => panic!("no Generate request reached the worker ({status}): {answer}"),
    }
}

/// The prompt's ids; its items' placeholder ranges cover exactly its
/// `image` tokens, in order.
fn checked_ids(request: &GenerateRequest, image: u32, label: &str) -> Vec<u32> {
    let ids = request
        .tokenized
        .as_ref()
        .map(|t| t.input_ids.clone())
        .expect("tokenized input");
    let items = request.mm_inputs.as_ref().map(|m| m.items.as_slice());
    let ranges: Vec<(usize, usize)> = items
        .unwrap_or_default()
        .iter()
        .flat_map(|item| &item.placeholders)
        .map(|r| (r.offset as usize, r.length as usize))
        .collect();
    let covered: Vec<usize> = ranges.iter().flat_map(|&(o, l)| o..o + l).collect();
    let images: Vec<usize> = (0..ids.len()).filter(|&i| ids[i] == image).collect();
    assert_eq!(covered, images, "{label}: placeholder ranges {ranges:?}");
    ids
}

async fn check_family(name: &str, family: Family) {
    let dir = tempfile::tempdir().expect("temp dir");
    write_model(&family, dir.path());
    let prepared: Vec<Prepared> = family
        .conversations
        .iter()
        .enumerate()
        .map(|(i, (messages, sizes))| prepare(messages, sizes, dir.path(), i))
        .collect();
    let expected = reference(&family, dir.path(), &prepared);
    let (gw, received) = gateway(dir.path()).await;
    let model = dir
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name");
    for (i, (p, want)) in prepared.iter().zip(&expected).enumerate() {
        let body = json!({"model": model, "messages": p.request, "max_tokens": 4});
        let image_id = family
            .specials
            .iter()
            .position(|s| s == family.image_token)
            .map(special_id)
            .expect("the image token is special");
        let label = format!("{name} conversation {i}");
        let got = checked_ids(&sent(&gw, &received, body).await, image_id, &label);
        let images = want.iter().filter(|&&t| t == image_id).count();
        assert!(
            images > 0,
            "{name} conversation {i}: the reference has image tokens"
        );
        assert_eq!(
            got.len(),
            want.len(),
            "{name} conversation {i}: prompt lengths differ"
        );
        if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
            let from = at.saturating_sub(8);
            panic!(
                "{name} conversation {i}: token {at} differs\n iris: {:?}\n   hf: {:?}",
                &got[from..(at + 8).min(got.len())],
                &want[from..(at + 8).min(want.len())]
            );
        }
    }
}

#[tokio::test]
async fn gemma3_prompts_equal_gemma3_processor() {
    check_family("gemma3", gemma3(false)).await;
}

#[tokio::test]
async fn gemma3_pan_and_scan_prompts_equal_gemma3_processor() {
    check_family("gemma3 pan and scan", gemma3(true)).await;
}

#[tokio::test]
async fn smolvlm_prompts_equal_idefics3_processor() {
    check_family("smolvlm", smolvlm()).await;
}

#[tokio::test]
async fn pixtral_prompts_equal_pixtral_processor() {
    check_family("pixtral", pixtral()).await;
}

#[tokio::test]
async fn llava_prompts_equal_llava_processor() {
    check_family("llava", llava(false)).await;
}

#[tokio::test]
async fn llava_next_prompts_equal_llava_next_processor() {
    check_family("llava_next", llava(true)).await;
}

#[tokio::test]
async fn qwen2_vl_prompts_equal_qwen2_vl_processor() {
    check_family("qwen2_vl", qwen2_vl()).await;
}

#[tokio::test]
async fn llava_onevision_prompts_equal_llava_onevision_processor() {
    check_family("llava_onevision", llava_onevision()).await;
}
