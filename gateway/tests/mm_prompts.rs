//! Prompts with images, exact to Hugging Face: for each vision-language
//! family whose placeholders need more than the image token repeated, the
//! token ids a gateway sends its worker for a multi-image, multi-turn chat
//! equal those of the family's own processor class (transformers 4.57.1)
//! — `processor(text=processor.apply_chat_template(messages), images=…)
//! ["input_ids"]` — run by `hf_processor_reference.py` beside this file.
//!
//! Each family gets its tiny model directory
//! ([`iris_model::tiny::Family::spec`]: the tiny byte-level BPE with a
//! `\n\n` merge and the family's special tokens, its real chat template,
//! its preprocessor and processor configs as the public checkpoints ship
//! them). A gateway serves the directory in front of a stub worker that
//! keeps the Generate requests it receives.
//!
//! And for the families whose templates take no tools (LLaVA-1.5, NeXT,
//! OneVision, SmolVLM, InternVL), a multi-turn tools chat with images
//! (`check_tools_chat`): its prompt equals the processor's for the
//! messages the gateway's tools fallback makes of it, written out.
//!
//! The interpreter is `$IRIS_HF_PYTHON` (CI: a venv cached under ~/.cache/iris, made
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
use iris_model::tiny::{Family as TinyFamily, FamilySpec};

/// One family's model directory and the Hugging Face processor's call.
struct Family {
    /// What the model directory holds.
    spec: FamilySpec,
    /// The transformers processor class and its keyword arguments.
    processor_class: &'static str,
    processor_kwargs: Value,
    /// The tokenizer class the processor takes, and extra arguments
    /// (Gemma 3's named tokens).
    tokenizer_class: &'static str,
    tokenizer_kwargs: Value,
    /// Per-call processor arguments.
    call_kwargs: Value,
    /// The images handed over nested per prompt (`[[a, b]]`), as a
    /// processor whose rules depend on the prompt's image count
    /// (OneVision's) takes a chat's images.
    nest_images: bool,
    /// Conversations in the OpenAI format; each `"IMAGE"` URL takes the
    /// next of `image_sizes` (width, height).
    conversations: Vec<(Value, Vec<(u32, u32)>)>,
}

/// `family`'s directory contents.
fn spec(family: TinyFamily) -> FamilySpec {
    family.spec().expect("a family with its own directory")
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

/// Gemma 3, pan and scan on in the config (`config`) or asked by the
/// request (`request`, its `mm_processor_kwargs`).
fn gemma3(config: bool, request: bool) -> Family {
    let mut spec = spec(TinyFamily::Gemma3);
    let mut call_kwargs = json!({});
    if config {
        // On in the config, as Iris reads it; Gemma3Processor's call turns
        // it off unless asked, so the reference asks.
        spec.preprocessor["do_pan_and_scan"] = json!(true);
    }
    if config || request {
        call_kwargs = json!({"do_pan_and_scan": true});
    }
    Family {
        spec,
        tokenizer_class: "PreTrainedTokenizerFast",
        processor_class: "Gemma3Processor",
        processor_kwargs: json!({"image_seq_length": 256}),
        tokenizer_kwargs: json!({"extra_special_tokens": {
            "image_token": "<image_soft_token>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
        }}),
        call_kwargs,
        nest_images: false,
        conversations: conversations(
            as_array,
            &[(640, 480), (1000, 300), (400, 700)],
            &[(300, 1000), (512, 512)],
        ),
    }
}

/// A family whose processor takes no tokenizer or call arguments.
fn plain(
    spec: FamilySpec,
    processor_class: &'static str,
    processor_kwargs: Value,
    conversations: Vec<(Value, Vec<(u32, u32)>)>,
) -> Family {
    Family {
        spec,
        tokenizer_class: "PreTrainedTokenizerFast",
        processor_class,
        processor_kwargs,
        tokenizer_kwargs: json!({}),
        call_kwargs: json!({}),
        nest_images: false,
        conversations,
    }
}

fn smolvlm() -> Family {
    plain(
        spec(TinyFamily::Idefics3),
        "Idefics3Processor",
        json!({"image_seq_len": 81}),
        smolvlm_conversations(),
    )
}

fn pixtral() -> Family {
    let mut family = plain(
        spec(TinyFamily::Pixtral),
        "PixtralProcessor",
        json!({"patch_size": 16, "spatial_merge_size": 1}),
        conversations(
            as_array,
            &[(640, 480), (100, 50), (700, 300)],
            &[(1300, 700), (33, 47)],
        ),
    );
    family.call_kwargs = json!({"return_tensors": "np"});
    family
}

/// LLaVA-1.5 (`clip`) or, with `anyres`, LLaVA-NeXT: the image token
/// repeated, 576 times or once per feature of the image's tiles.
fn llava(anyres: bool) -> Family {
    let (family, processor_class) = match anyres {
        true => (TinyFamily::LlavaNext, "LlavaNextProcessor"),
        false => (TinyFamily::Llava, "LlavaProcessor"),
    };
    let spec = spec(family);
    let kwargs = spec.processor_config.clone();
    plain(
        spec,
        processor_class,
        kwargs,
        answer_as_parts(
            &[(640, 480), (100, 50), (900, 200)],
            &[(1300, 700), (336, 336)],
        ),
    )
}

/// Qwen2-VL-7B-Instruct's own chat template and image processor config
/// (crates/model/tests/fixtures) on the tiny vocabulary: `<|image_pad|>`
/// repeated once per merged patch.
fn qwen2_vl() -> Family {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/model/tests/fixtures/Qwen2-VL-7B-Instruct");
    let template = read_json(&fixture.join("chat_template.json"))["chat_template"]
        .as_str()
        .expect("a chat_template string")
        .to_owned();
    let specials = iris_model::tiny::SPECIAL_TOKENS.map(|(t, _)| t.to_owned());
    let spec = FamilySpec {
        model_type: "qwen2_vl",
        architecture: "Qwen2VLForConditionalGeneration",
        specials: specials.to_vec(),
        bos: "<|endoftext|>",
        eos: "<|im_end|>",
        image_token: "<|image_pad|>",
        template,
        preprocessor: read_json(&fixture.join("preprocessor_config.json")),
        processor_config: json!({"processor_class": "Qwen2VLProcessor"}),
    };
    let mut family = plain(
        spec,
        "Qwen2VLProcessor",
        json!({}),
        conversations(
            as_array,
            &[(640, 480), (100, 50), (300, 900)],
            &[(1300, 700), (56, 56)],
        ),
    );
    family.tokenizer_class = "Qwen2TokenizerFast";
    family
}

/// LLaVA-OneVision, its images nested per prompt: a chat's only image
/// takes `<image>` once per feature of its tiles (anyres_max_9); each of a
/// chat's several images one square tile's 729 features and a newline.
fn llava_onevision() -> Family {
    let spec = spec(TinyFamily::LlavaOnevision);
    let kwargs = spec.processor_config.clone();
    let mut chats = answer_as_parts(
        &[(640, 480), (100, 50), (900, 200)],
        &[(1300, 700), (384, 384)],
    );
    let single = json!([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "IMAGE"}},
        {"type": "text", "text": "What is this?"},
    ]}]);
    chats.push((single, vec![(640, 480)]));
    let mut family = plain(spec, "LlavaOnevisionProcessor", kwargs, chats);
    family.nest_images = true;
    family
}

/// InternVL 3 / 3.5: `<img>`, 256 `<IMG_CONTEXT>` per tile and
/// thumbnail, `</img>`; the tokenizer names the four image tokens.
fn internvl() -> Family {
    let mut family = plain(
        spec(TinyFamily::Internvl),
        "InternVLProcessor",
        json!({"image_seq_length": 256}),
        conversations(
            as_array,
            &[(800, 600), (200, 150), (500, 1400)],
            &[(1000, 300), (448, 448)],
        ),
    );
    family.tokenizer_kwargs = json!({"extra_special_tokens": {
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    }});
    family
}

/// Llama 4: `<|image|>` becomes the tiles' `<|patch|>` runs with their
/// separators, then `<|image|>` and the global tile's; 144 per tile. Its
/// image processor exists only as the fast (torchvision) class.
fn llama4() -> Family {
    let mut family = plain(
        spec(TinyFamily::Llama4),
        "Llama4Processor",
        json!({"patch_size": 14, "pixel_shuffle_ratio": 0.5}),
        conversations(
            as_array,
            &[(800, 600), (200, 150), (500, 1400)],
            &[(1000, 300), (336, 336)],
        ),
    );
    family.call_kwargs = json!({"return_tensors": "pt"});
    family
}

/// Phi-4-multimodal: `<|image|>` repeated `num_img_tokens` times (the
/// global frame's 256 + 16 row ends, a separator, and the tiles' unpadded
/// features with their row ends). The processor also takes an audio
/// feature extractor and a GPT-2 tokenizer that names the image and
/// audio tokens; its image processor exists only as the fast class.
fn phi4_multimodal() -> Family {
    let mut family = plain(
        spec(TinyFamily::Phi4Multimodal),
        "Phi4MultimodalProcessor",
        json!({}),
        conversations(
            as_array,
            &[(800, 600), (200, 150), (500, 1400)],
            &[(1000, 300), (448, 448)],
        ),
    );
    family.tokenizer_class = "GPT2TokenizerFast";
    family.tokenizer_kwargs = json!({"extra_special_tokens": {
        "image_token": "<|image|>",
        "audio_token": "<|audio|>",
    }});
    family
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
    tokenizer["bos_token"] = json!(family.spec.bos);
    tokenizer["eos_token"] = json!(family.spec.eos);
    let request = json!({
        "model_dir": dir,
        "processor_class": family.processor_class,
        "processor_kwargs": family.processor_kwargs,
        "tokenizer_class": family.tokenizer_class,
        "tokenizer": tokenizer,
        "call_kwargs": family.call_kwargs,
        "nest_images": family.nest_images,
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
    check_family_asking(name, family, None).await;
}

/// [`check_family`] with the requests' `mm_processor_kwargs`.
async fn check_family_asking(name: &str, family: Family, kwargs: Option<Value>) {
    let dir = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_family(dir.path(), &family.spec).expect("model directory");
    let prepared: Vec<Prepared> = family
        .conversations
        .iter()
        .enumerate()
        .map(|(i, (messages, sizes))| prepare(messages, sizes, dir.path(), i))
        .collect();
    let extra = match kwargs {
        Some(kwargs) => json!({"mm_processor_kwargs": kwargs}),
        None => json!({}),
    };
    expect_reference_prompts(name, &family, dir.path(), &prepared, &extra).await;
}

/// The prompts a gateway serving `dir` sends its worker for `prepared`'s
/// requests (each with `extra`'s fields) equal the reference processor's
/// for their Hugging Face messages.
async fn expect_reference_prompts(
    name: &str,
    family: &Family,
    dir: &Path,
    prepared: &[Prepared],
    extra: &Value,
) {
    let expected = reference(family, dir, prepared);
    let (gw, received) = gateway(dir).await;
    let model = dir.file_name().and_then(|n| n.to_str()).expect("name");
    for (i, (p, want)) in prepared.iter().zip(&expected).enumerate() {
        let mut body = json!({"model": model, "messages": p.request, "max_tokens": 4});
        for (key, value) in extra.as_object().into_iter().flatten() {
            body[key] = value.clone();
        }
        let image_id = family
            .spec
            .image_token_id()
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

/// The tool of [`check_tools_chat`].
fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}})
}

/// A multi-turn tools chat with images on a family whose template takes
/// no tools: a system message, a question with an image, the model's
/// call, the tool's answer and a turn opening with an image, sent with
/// `tools`. Its prompt must equal the reference processor's for the
/// messages the gateway's fallback makes of it, written out as parts
/// (the tools block after the system text, the call as a `<tool_call>`
/// block, the answer as a user turn holding a `<tool_response>` block):
/// every text in place, each image expanded as in a chat without tools.
async fn check_tools_chat(name: &str, family: Family, sizes: &[(u32, u32)]) {
    let text = |t: &str| json!({"type": "text", "text": t});
    let image = || json!({"type": "image_url", "image_url": {"url": "IMAGE"}});
    let question = json!([text("What is the weather where this was taken?"), image()]);
    let follow_up = json!([image(), text("And here?")]);
    let request = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": question.clone()},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
        {"role": "user", "content": follow_up.clone()},
    ]);
    let tools = json!([weather_tool()]);
    let mut system = json!([{"role": "system", "content": "Be brief."}]);
    iris_openai::tools_fallback(
        &mut system,
        Some(&tools),
        iris_openai::FallbackSyntax::Hermes,
    );
    let system = system[0]["content"].as_str().expect("the system text");
    assert!(system.starts_with("Be brief.\n\n# Tools\n\n"), "{system}");
    let call =
        "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>";
    let hf = json!([
        {"role": "system", "content": [text(system)]},
        {"role": "user", "content": question},
        {"role": "assistant", "content": [text(call)]},
        {"role": "user", "content": [text("<tool_response>\n18 C and sunny\n</tool_response>")]},
        {"role": "user", "content": follow_up},
    ]);
    let dir = tempfile::tempdir().expect("temp dir");
    iris_model::tiny::write_family(dir.path(), &family.spec).expect("model directory");
    let mut prepared = prepare(&request, sizes, dir.path(), 0);
    prepared.hf_messages = prepare(&hf, sizes, dir.path(), 0).hf_messages;
    let extra = json!({"tools": tools});
    expect_reference_prompts(name, &family, dir.path(), &[prepared], &extra).await;
}

#[tokio::test]
async fn gemma3_prompts_equal_gemma3_processor() {
    check_family("gemma3", gemma3(false, false)).await;
}

#[tokio::test]
async fn gemma3_pan_and_scan_prompts_equal_gemma3_processor() {
    check_family("gemma3 pan and scan", gemma3(true, false)).await;
}

/// Pan and scan asked per request (`mm_processor_kwargs.do_pan_and_scan`)
/// over a config without it, as `Gemma3Processor(..., do_pan_and_scan=True)`.
#[tokio::test]
async fn gemma3_pan_and_scan_per_request_equals_gemma3_processor() {
    let kwargs = json!({"do_pan_and_scan": true});
    check_family_asking(
        "gemma3 pan and scan per request",
        gemma3(false, true),
        Some(kwargs),
    )
    .await;
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

#[tokio::test]
async fn internvl_prompts_equal_internvl_processor() {
    check_family("internvl", internvl()).await;
}

#[tokio::test]
async fn llama4_prompts_equal_llama4_processor() {
    check_family("llama4", llama4()).await;
}

#[tokio::test]
async fn phi4_multimodal_prompts_equal_phi4_multimodal_processor() {
    check_family("phi4_multimodal", phi4_multimodal()).await;
}

#[tokio::test]
async fn llava_tools_chat_equals_llava_processor_on_the_fallback() {
    check_tools_chat("llava tools", llava(false), &[(640, 480), (300, 500)]).await;
}

#[tokio::test]
async fn llava_next_tools_chat_equals_llava_next_processor_on_the_fallback() {
    check_tools_chat("llava_next tools", llava(true), &[(640, 480), (300, 500)]).await;
}

#[tokio::test]
async fn llava_onevision_tools_chat_equals_llava_onevision_processor_on_the_fallback() {
    check_tools_chat(
        "llava_onevision tools",
        llava_onevision(),
        &[(640, 480), (300, 500)],
    )
    .await;
}

#[tokio::test]
async fn smolvlm_tools_chat_equals_idefics3_processor_on_the_fallback() {
    check_tools_chat("smolvlm tools", smolvlm(), &[(800, 600), (200, 150)]).await;
}

#[tokio::test]
async fn internvl_tools_chat_equals_internvl_processor_on_the_fallback() {
    check_tools_chat("internvl tools", internvl(), &[(800, 600), (448, 448)]).await;
}
