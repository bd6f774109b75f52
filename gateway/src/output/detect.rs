//! Which parsers a model gets with `auto`, from its directory: the chat
//! template, the tokenizer's tokens (`tokenizer_config.json`), the
//! `model_type` and `architectures` of `config.json` (and of its
//! `text_config` / `llm_config`), and the directory's name.
//!
//! Tool calls — the first rule that matches:
//!
//! | Syntax | Marker in the template or the tokenizer's tokens | Else by `model_type` / architecture (when the template takes `tools`) |
//! |---|---|---|
//! | `qwen3_coder` | `<function=` (template only), or a Qwen3 whose directory name holds `coder` | |
//! | `deepseek_v32` | `｜DSML｜` | `deepseek_v32`, unless the template writes V3's `<｜tool▁calls▁begin｜>` (V3.2-Exp's does) |
//! | `harmony` | `<\|channel\|>` | `gpt_oss` |
//! | `glm45` | `<arg_key>` | `glm4_moe`, `glm4v_moe` |
//! | `kimi_k2` | `<\|tool_calls_section_begin\|>` | `kimi_k2` |
//! | `deepseek_v3` | `<｜tool▁calls▁begin｜>` | `deepseek_v3` |
//! | `mistral` | `[TOOL_CALLS]` | `mistral`, `mistral3`, `pixtral` |
//! | `internlm` | `<\|action_start\|>` | `internlm2` (also as InternVL's language model) |
//! | `function_gemma` | `<start_function_call>` | (none: FunctionGemma's `gemma3_text` is also plain Gemma 3's) |
//! | `pythonic` | `<\|python_start\|>`, `func_name1(` | `llama4`, `gemma3`, `gemma3n` |
//! | `phi4_mini` | `<\|tool\|>`, `functools[` | `phi4mm`, `phi4_multimodal`, `phi3` (Phi-4-mini's) |
//! | `llama3_json` | `<\|python_tag\|>` | `llama`, `mllama` |
//! | `hermes` | `<tool_call>` | `qwen…` |
//!
//! Qwen3-Coder's row comes first, DeepSeek V3.2's second (whole: V3.2's
//! tokenizer still holds V3's tool tokens, which must not pick V3's
//! syntax for it; a V3.2 template that takes no tools gets `hermes`, as
//! below); then the markers are looked for in the template, over every
//! row (a template that writes DeepSeek V3's markers for earlier calls
//! but does not read `tools`, V3.1's and R1's, keeps `deepseek_v3`: the
//! fallback block then asks for that syntax,
//! [`crate::prompt::Prompter::ask_for_calls_of`]); a template that does
//! not read `tools` gets `hermes` before the
//! tokenizer's tokens or the `model_type` column are consulted, because
//! the gateway then puts its fallback tools block in the prompt, which
//! asks for Hermes calls (a vision model's tokenizer often keeps its
//! language model's tool tokens, Llama 3.1's `<|python_tag|>` say, while
//! its template takes no tools); then the markers among the tokens, then
//! the `model_type`. A template that takes tools in no syntax of the
//! table gets none (its calls stay text).
//!
//! Reasoning: `harmony` with the Harmony tool syntax (gpt-oss);
//! `kimi` when `◁think▷` is there; `deepseek_r1` for a DeepSeek model
//! (`deepseek_v3`, or `<｜Assistant｜>` in the template) whose directory
//! name holds `r1`; `qwen3` (`<think>`, also GLM-4.5's and DeepSeek
//! V3.1's) when the template mentions `<think>` or the directory name
//! holds `thinking`; none otherwise.

use iris_model::ModelDir;
use serde_json::Value;

use super::{ReasoningFormat, ToolFormat};

/// What detection looks at.
#[derive(Debug, Clone)]
pub struct Clues<'a> {
    template: &'a str,
    /// The tokenizer config, serialised (its added and special tokens).
    tokens: String,
    /// `model_type` and `architectures` at the top of `config.json` and
    /// in its language-model section, lowercased.
    models: Vec<String>,
    /// The directory's name, lowercased.
    name: String,
}

impl<'a> Clues<'a> {
    /// The clues of `dir` served with `template`.
    pub fn new(dir: &ModelDir, template: &'a str) -> Self {
        let raw = &dir.config.raw;
        let sections = [Some(raw), raw.get("text_config"), raw.get("llm_config")];
        let mut models = vec![dir.config.model_type.to_lowercase()];
        for section in sections.into_iter().flatten() {
            if let Some(t) = section.get("model_type").and_then(Value::as_str) {
                models.push(t.to_lowercase());
            }
            let archs = section.get("architectures").and_then(Value::as_array);
            for a in archs.into_iter().flatten().filter_map(Value::as_str) {
                models.push(a.to_lowercase());
            }
        }
        let tokens = match &dir.tokenizer_config.raw {
            Value::Null => String::new(),
            raw => raw.to_string(),
        };
        let name = dir
            .root
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        Self {
            template,
            tokens,
            models,
            name,
        }
    }

    /// A marker in the template or among the tokenizer's tokens.
    fn has(&self, marker: &str) -> bool {
        self.template.contains(marker) || self.tokens.contains(marker)
    }

    /// A `model_type` or architecture starting with one of `prefixes`.
    fn model(&self, prefixes: &[&str]) -> bool {
        self.models
            .iter()
            .any(|m| prefixes.iter().any(|p| m.starts_with(p)))
    }
}

/// One row of the tool-syntax table.
struct Row {
    format: ToolFormat,
    markers: &'static [&'static str],
    models: &'static [&'static str],
}

/// The table of the module docs, in order (Qwen3-Coder's and DeepSeek
/// V3.2's rows are special and handled in [`tools`]).
const ROWS: &[Row] = &[
    Row {
        format: ToolFormat::Harmony,
        markers: &["<|channel|>"],
        models: &["gpt_oss"],
    },
    Row {
        format: ToolFormat::Glm45,
        markers: &["<arg_key>"],
        models: &["glm4_moe", "glm4v_moe"],
    },
    Row {
        format: ToolFormat::KimiK2,
        markers: &["<|tool_calls_section_begin|>"],
        models: &["kimi_k2"],
    },
    Row {
        format: ToolFormat::DeepSeekV3,
        markers: &["<｜tool▁calls▁begin｜>"],
        models: &["deepseek_v3"],
    },
    Row {
        format: ToolFormat::Mistral,
        markers: &["[TOOL_CALLS]"],
        models: &["mistral", "pixtral"],
    },
    Row {
        format: ToolFormat::InternLm,
        markers: &["<|action_start|>"],
        models: &["internlm2"],
    },
    Row {
        format: ToolFormat::FunctionGemma,
        markers: &["<start_function_call>"],
        models: &[],
    },
    Row {
        format: ToolFormat::Pythonic,
        markers: &["<|python_start|>", "func_name1("],
        models: &["llama4", "gemma3"],
    },
    Row {
        format: ToolFormat::Phi4Mini,
        markers: &["<|tool|>", "functools["],
        models: &["phi4mm", "phi4_multimodal", "phi3"],
    },
    Row {
        format: ToolFormat::Llama3Json,
        markers: &["<|python_tag|>"],
        models: &["llama", "mllama"],
    },
    Row {
        format: ToolFormat::Hermes,
        markers: &["<tool_call>"],
        models: &["qwen"],
    },
];

/// The tool-call syntax `auto` picks.
pub fn tools(clues: &Clues) -> Option<ToolFormat> {
    let coder = clues.model(&["qwen3"]) && clues.name.contains("coder");
    if clues.template.contains("<function=") || coder {
        return Some(ToolFormat::Qwen3Coder);
    }
    if let Some(format) = deepseek_v32(clues) {
        return Some(format);
    }
    if let Some(format) = marked_in(clues.template) {
        return Some(format);
    }
    if !clues.template.contains("tools") {
        return Some(ToolFormat::Hermes);
    }
    marked_in(&clues.tokens).or_else(|| {
        ROWS.iter()
            .find(|row| clues.model(row.models))
            .map(|row| row.format)
    })
}

/// The syntax of the first row with a marker in `text`.
fn marked_in(text: &str) -> Option<ToolFormat> {
    ROWS.iter()
        .find(|row| row.markers.iter().any(|m| text.contains(m)))
        .map(|row| row.format)
}

/// DeepSeek V3.2's row: its DSML marker, or its `model_type` unless the
/// template writes V3's syntax (V3.2-Exp's template); `hermes` for a V3.2
/// template that takes no tools (the fallback block asks for it).
fn deepseek_v32(clues: &Clues) -> Option<ToolFormat> {
    if clues.has("｜DSML｜") {
        return Some(ToolFormat::DeepSeekV32);
    }
    let v3_template = clues
        .template
        .contains(iris_parsers::deepseek_v3::CALLS_OPEN);
    if !clues.model(&["deepseek_v32"]) || v3_template {
        return None;
    }
    Some(if clues.template.contains("tools") {
        ToolFormat::DeepSeekV32
    } else {
        ToolFormat::Hermes
    })
}

/// The reasoning markup `auto` picks, given the tool syntax.
pub fn reasoning(clues: &Clues, tools: Option<ToolFormat>) -> Option<ReasoningFormat> {
    if tools == Some(ToolFormat::Harmony) || clues.model(&["gpt_oss"]) {
        return Some(ReasoningFormat::Harmony);
    }
    if clues.has("◁think▷") {
        return Some(ReasoningFormat::Kimi);
    }
    let deepseek = clues.model(&["deepseek_v3"]) || clues.template.contains("<｜Assistant｜>");
    if deepseek && clues.name.contains("r1") {
        return Some(ReasoningFormat::DeepSeekR1);
    }
    (clues.template.contains("<think>") || clues.name.contains("thinking"))
        .then_some(ReasoningFormat::Think)
}

#[cfg(test)]
mod tests {
    use super::super::{OutputParsers, ReasoningParserFlag, ToolParserFlag};
    use super::*;
    use serde_json::json;

    /// A model directory `name` with these `config.json` and
    /// `tokenizer_config.json` (added tokens given by their contents).
    fn model_dir(name: &str, config: Value, tokens: &[&str]) -> (tempfile::TempDir, ModelDir) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join(name);
        std::fs::create_dir(&path).expect("mkdir");
        let added: serde_json::Map<String, Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                (
                    (1000 + i).to_string(),
                    json!({"content": t, "special": true}),
                )
            })
            .collect();
        let write = |file: &str, value: Value| {
            std::fs::write(path.join(file), value.to_string()).expect("write");
        };
        write("config.json", config);
        write(
            "tokenizer_config.json",
            json!({"added_tokens_decoder": added}),
        );
        let dir = ModelDir::load(&path).expect("model dir");
        (tmp, dir)
    }

    /// What `auto` picks for both parsers.
    type Picked = (Option<ToolFormat>, Option<ReasoningFormat>);

    /// A model directory's name, `config.json`, special tokens and
    /// template, and what `auto` must pick for it.
    type Case = (&'static str, Value, &'static [&'static str], String, Picked);

    /// `auto` for both parsers.
    fn auto(name: &str, config: Value, tokens: &[&str], template: &str) -> Picked {
        let (_tmp, dir) = model_dir(name, config, tokens);
        let p = OutputParsers::choose(
            ToolParserFlag::Auto,
            ReasoningParserFlag::Auto,
            &dir,
            template,
        );
        (p.tools, p.reasoning)
    }

    const TOOLS: &str = "{% if tools %}{{ tools | tojson }}{% endif %}";

    /// Phi-4-mini's and Phi-4-multimodal's chat template (its tools part).
    const PHI4_TEMPLATE: &str = "{% for message in messages %}{% if message['role'] == 'system' \
        and 'tools' in message and message['tools'] is not none %}{{ '<|' + message['role'] + '|>' \
        + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}\
        {{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}";

    /// FunctionGemma's chat template (its tool parts, abridged).
    const FUNCTION_GEMMA_TEMPLATE: &str = "{%- if tools -%}{%- for tool in tools -%}\
        {{- '<start_function_declaration>' + declaration(tool) + '<end_function_declaration>' -}}\
        {%- endfor -%}{%- endif -%}{%- for call in message['tool_calls'] -%}\
        {{- '<start_function_call>call:' + call['function']['name'] + '{' -}}\
        {{- key + ':<escape>' + value + '<escape>' -}}{{- '}<end_function_call>' -}}{%- endfor -%}";

    /// A DeepSeek V3.2 template that lists the tools in DSML.
    const DSML_TEMPLATE: &str =
        "{% if tools %}<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\
        {{ tools | tojson }}{% endif %}<｜Assistant｜><think>";

    /// DeepSeek V3's tool tokens, which V3.2's tokenizer still holds.
    const V3_TOKENS: &[&str] = &[
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
    ];

    #[test]
    fn families_by_their_markers() {
        use ReasoningFormat as R;
        use ToolFormat as T;
        let cases: &[Case] = &[
            (
                "gpt-oss-20b",
                json!({"model_type": "gpt_oss"}),
                &["<|start|>", "<|channel|>", "<|message|>"],
                TOOLS.into(),
                (Some(T::Harmony), Some(R::Harmony)),
            ),
            (
                "GLM-4.5-Air",
                json!({"model_type": "glm4_moe"}),
                &["<tool_call>", "<arg_key>"],
                format!("{TOOLS}<think></think>"),
                (Some(T::Glm45), Some(R::Think)),
            ),
            (
                "Kimi-K2-Instruct",
                json!({"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]}),
                &["<|tool_calls_section_begin|>"],
                TOOLS.into(),
                (Some(T::KimiK2), None),
            ),
            (
                "DeepSeek-R1-0528",
                json!({"model_type": "deepseek_v3"}),
                &["<｜tool▁calls▁begin｜>"],
                format!("{TOOLS}<｜Assistant｜><think>\n"),
                (Some(T::DeepSeekV3), Some(R::DeepSeekR1)),
            ),
            (
                "DeepSeek-V3.1",
                json!({"model_type": "deepseek_v3"}),
                &["<｜tool▁calls▁begin｜>"],
                format!("{TOOLS}<｜Assistant｜><think>"),
                (Some(T::DeepSeekV3), Some(R::Think)),
            ),
            (
                "DeepSeek-V3.2",
                json!({"model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"]}),
                V3_TOKENS,
                DSML_TEMPLATE.into(),
                (Some(T::DeepSeekV32), Some(R::Think)),
            ),
            (
                "functiongemma-270m-it",
                json!({"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}),
                &["<start_function_call>", "<end_function_call>", "<escape>"],
                FUNCTION_GEMMA_TEMPLATE.into(),
                (Some(T::FunctionGemma), None),
            ),
            (
                "Mistral-Small-3.2-24B-Instruct-2506",
                json!({"model_type": "mistral3"}),
                &["[TOOL_CALLS]", "[ARGS]"],
                TOOLS.into(),
                (Some(T::Mistral), None),
            ),
            (
                "internlm2_5-7b-chat",
                json!({"model_type": "internlm2"}),
                &["<|action_start|>", "<|plugin|>"],
                TOOLS.into(),
                (Some(T::InternLm), None),
            ),
            (
                "Llama-3.1-8B-Instruct",
                json!({"model_type": "llama"}),
                &["<|python_tag|>", "<|eot_id|>"],
                TOOLS.into(),
                (Some(T::Llama3Json), None),
            ),
            (
                "Llama-4-Scout-17B-16E-Instruct",
                json!({"model_type": "llama4"}),
                &["<|python_start|>", "<|python_end|>"],
                TOOLS.into(),
                (Some(T::Pythonic), None),
            ),
            (
                "Phi-4-mini-instruct",
                json!({"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}),
                &["<|tool|>", "<|/tool|>", "<|tool_call|>", "<|end|>"],
                PHI4_TEMPLATE.into(),
                (Some(T::Phi4Mini), None),
            ),
            (
                "Phi-4-multimodal-instruct",
                json!({"model_type": "phi4mm"}),
                &["<|endoftext10|>", "<|endoftext11|>"],
                PHI4_TEMPLATE.into(),
                (Some(T::Phi4Mini), None),
            ),
            (
                "Kimi-VL-A3B-Thinking",
                json!({"model_type": "kimi_vl"}),
                &[],
                "◁think▷".into(),
                (Some(T::Hermes), Some(R::Kimi)),
            ),
            (
                "Qwen3-VL-8B-Thinking",
                json!({"model_type": "qwen3_vl"}),
                &["<tool_call>", "<think>"],
                format!("{TOOLS}<tool_call>"),
                (Some(T::Hermes), Some(R::Think)),
            ),
        ];
        for (name, config, tokens, template, expected) in cases {
            assert_eq!(
                auto(name, config.clone(), tokens, template),
                *expected,
                "{name}"
            );
        }
    }

    #[test]
    fn families_by_model_type_when_the_template_takes_tools() {
        use ToolFormat as T;
        let internvl = json!({"model_type": "internvl_chat",
            "llm_config": {"architectures": ["InternLM2ForCausalLM"]}});
        assert_eq!(
            auto("InternVL2_5-8B", internvl, &[], TOOLS).0,
            Some(T::InternLm)
        );
        let gemma = json!({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}});
        assert_eq!(
            auto("gemma-3-4b-it", gemma.clone(), &[], TOOLS).0,
            Some(T::Pythonic)
        );
        // Gemma's own template takes no tools: the fallback block asks for
        // Hermes calls.
        assert_eq!(
            auto("gemma-3-4b-it", gemma, &[], "{{ messages }}").0,
            Some(T::Hermes)
        );
        let coder = json!({"model_type": "qwen3_moe"});
        assert_eq!(
            auto(
                "Qwen3-Coder-30B-A3B-Instruct",
                coder,
                &["<tool_call>"],
                TOOLS
            )
            .0,
            Some(T::Qwen3Coder)
        );
        // Phi-4-multimodal (both configs) and Phi-4-mini (`phi3`) whose
        // templates take tools without the `<|tool|>` marker.
        for (name, config) in [
            (
                "Phi-4-multimodal-instruct",
                json!({"model_type": "phi4mm",
                "architectures": ["Phi4MMForCausalLM"]}),
            ),
            ("phi4-mm-hf", json!({"model_type": "phi4_multimodal"})),
            ("Phi-4-mini-instruct", json!({"model_type": "phi3"})),
        ] {
            assert_eq!(
                auto(name, config, &[], TOOLS).0,
                Some(T::Phi4Mini),
                "{name}"
            );
        }
        // Phi-4 (14B) is a `phi3` too, but its template takes no tools:
        // the fallback block asks for Hermes calls.
        let phi4 = json!({"model_type": "phi3"});
        assert_eq!(
            auto("phi-4", phi4, &[], "{{ messages }}").0,
            Some(T::Hermes)
        );
        // DeepSeek V3.2 with a template that takes tools but names no
        // syntax: its model type wins over V3's tokens in its tokenizer;
        // with one that takes no tools, the fallback block's Hermes;
        // V3.2-Exp's template writes V3's syntax.
        let v32 = json!({"model_type": "deepseek_v32"});
        for (template, expected) in [
            (TOOLS.to_owned(), T::DeepSeekV32),
            ("{{ messages }}".to_owned(), T::Hermes),
            (
                format!("{TOOLS}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"),
                T::DeepSeekV3,
            ),
        ] {
            assert_eq!(
                auto("DeepSeek-V3.2", v32.clone(), V3_TOKENS, &template).0,
                Some(expected),
                "{template}"
            );
        }
        // `gemma3_text` without FunctionGemma's markers is plain Gemma 3.
        let gemma_text = json!({"model_type": "gemma3_text"});
        assert_eq!(
            auto("gemma-3-1b-it", gemma_text, &[], TOOLS).0,
            Some(T::Pythonic)
        );
        // A template that takes tools in a syntax we do not know: none.
        let command_r = json!({"model_type": "cohere2"});
        assert_eq!(
            auto("c4ai-command-r7b-12-2024", command_r, &[], TOOLS),
            (None, None)
        );
    }

    /// LLaVA-1.5 / NeXT / OneVision, Idefics3 / SmolVLM and InternVL 3 /
    /// 3.5 (HF format): their templates take no tools, so the fallback
    /// block asks for Hermes calls, whatever tool tokens their language
    /// model's tokenizer keeps.
    #[test]
    fn vision_families_whose_templates_take_no_tools_get_hermes() {
        use iris_model::tiny::{write_tiny_model, Family};
        let picked = (Some(ToolFormat::Hermes), None);
        // The tiny models' directories (`iris tiny-model --family`).
        for family in [
            Family::Llava,
            Family::LlavaNext,
            Family::LlavaOnevision,
            Family::Idefics3,
            Family::Internvl,
        ] {
            let tmp = tempfile::tempdir().expect("tempdir");
            write_tiny_model(tmp.path(), family).expect("tiny model");
            let dir = ModelDir::load(tmp.path()).expect("model dir");
            let template = dir.chat_template().expect("template").to_owned();
            let p = OutputParsers::choose(
                ToolParserFlag::Auto,
                ReasoningParserFlag::Auto,
                &dir,
                &template,
            );
            assert_eq!((p.tools, p.reasoning), picked, "{family:?}");
        }
        // The checkpoints' configs and tool tokens, with the same templates.
        let template = |family: Family| family.spec().expect("spec").template;
        let cases: &[(&str, Value, &[&str], Family)] = &[
            (
                "llava-1.5-7b-hf",
                json!({"model_type": "llava", "text_config": {"model_type": "llama"}}),
                &["<image>"],
                Family::Llava,
            ),
            (
                "llava-onevision-qwen2-7b-ov-hf",
                json!({"model_type": "llava_onevision", "text_config": {"model_type": "qwen2"}}),
                &["<|im_start|>", "<image>"],
                Family::LlavaOnevision,
            ),
            // A Llama 3.1 tokenizer names `<|python_tag|>`: it must not
            // pick llama3_json over the fallback block's syntax.
            (
                "Idefics3-8B-Llama3",
                json!({"model_type": "idefics3", "text_config": {"model_type": "llama"}}),
                &["<|python_tag|>", "<|eot_id|>", "<end_of_utterance>"],
                Family::Idefics3,
            ),
            (
                "SmolVLM-Instruct",
                json!({"model_type": "idefics3", "text_config": {"model_type": "llama"}}),
                &["<end_of_utterance>"],
                Family::Idefics3,
            ),
            // InternVL3 (Qwen2.5) and InternVL3.5 (Qwen3): Qwen's tokens.
            (
                "InternVL3-8B-hf",
                json!({"model_type": "internvl", "text_config": {"model_type": "qwen2"}}),
                &["<tool_call>", "</tool_call>", "<IMG_CONTEXT>"],
                Family::Internvl,
            ),
            (
                "InternVL3_5-8B-HF",
                json!({"model_type": "internvl", "text_config": {"model_type": "qwen3"}}),
                &["<tool_call>", "<think>", "<IMG_CONTEXT>"],
                Family::Internvl,
            ),
        ];
        for (name, config, tokens, family) in cases {
            assert_eq!(
                auto(name, config.clone(), tokens, &template(*family)),
                picked,
                "{name}"
            );
        }
        // The same tokenizer with a template that takes tools: its marker.
        let llama = json!({"model_type": "idefics3", "text_config": {"model_type": "llama"}});
        assert_eq!(
            auto("Idefics3-8B-Llama3", llama, &["<|python_tag|>"], TOOLS).0,
            Some(ToolFormat::Llama3Json)
        );
    }

    #[test]
    fn an_explicit_flag_always_wins() {
        let (_tmp, dir) = model_dir(
            "gpt-oss-20b",
            json!({"model_type": "gpt_oss"}),
            &["<|channel|>"],
        );
        let p = OutputParsers::choose(
            ToolParserFlag::Mistral,
            ReasoningParserFlag::None,
            &dir,
            TOOLS,
        );
        assert_eq!((p.tools, p.reasoning), (Some(ToolFormat::Mistral), None));
        let p = OutputParsers::choose(
            ToolParserFlag::Gemma,
            ReasoningParserFlag::Kimi,
            &dir,
            TOOLS,
        );
        assert_eq!(
            (p.tools, p.reasoning),
            (Some(ToolFormat::Pythonic), Some(ReasoningFormat::Kimi))
        );
        for (flag, format) in [
            (ToolParserFlag::DeepseekV32, ToolFormat::DeepSeekV32),
            (ToolParserFlag::FunctionGemma, ToolFormat::FunctionGemma),
        ] {
            let p = OutputParsers::choose(flag, ReasoningParserFlag::None, &dir, TOOLS);
            assert_eq!(p.tools, Some(format));
        }
    }
}
