//! How generated text becomes `content`, `reasoning_content` and
//! `tool_calls`: which parsers a model gets ([`OutputParsers`], chosen at
//! start-up from the model directory ([`detect`]) or the
//! `--tool-call-parser` and `--reasoning-parser` flags), and what one
//! request needs ([`OutputPlan`], which builds one [`OutputShaper`] per
//! choice and names the special tokens the decoded text must keep for the
//! parsers to see their markers).

pub mod detect;

use std::sync::Arc;

use iris_model::ModelDir;
use iris_openai::{ChatCompletionRequest, Sampling, ToolOutput};
use iris_parsers::qwen3_coder::ParamTypes;
use iris_parsers::reasoning::{ThinkTags, KIMI, THINK};
use iris_parsers::{OutputShaper, ReasoningParser, ToolCallParser, ToolSyntax};
use tokenizers::Tokenizer;

/// `--tool-call-parser`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolParserFlag {
    /// Chosen from the model directory.
    #[value(name = "auto")]
    Auto,
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.
    #[value(name = "hermes")]
    Hermes,
    /// `<tool_call><function=...><parameter=...>` (Qwen3-Coder).
    #[value(name = "qwen3_coder")]
    Qwen3Coder,
    /// `<|python_tag|>{"name": ..., "parameters": ...}` (Llama 3.x).
    #[value(name = "llama3_json")]
    Llama3Json,
    /// `[f(a=1), g()]` (Llama 3.2 / Llama 4 pythonic templates).
    #[value(name = "pythonic")]
    Pythonic,
    /// Gemma 3: the pythonic syntax its tool templates ask for.
    #[value(name = "gemma")]
    Gemma,
    /// `[TOOL_CALLS]` (Mistral, both forms).
    #[value(name = "mistral")]
    Mistral,
    /// `<|action_start|><|plugin|>` (InternLM2, InternVL).
    #[value(name = "internlm")]
    Internlm,
    /// `<|tool_calls_section_begin|>` (Kimi K2).
    #[value(name = "kimi_k2")]
    KimiK2,
    /// `<tool_call>NAME<arg_key>…` (GLM-4.5, GLM-4.5V, GLM-4.6).
    #[value(name = "glm45")]
    Glm45,
    /// `<｜tool▁calls▁begin｜>` (DeepSeek V3, R1, V3.1).
    #[value(name = "deepseek_v3")]
    DeepseekV3,
    /// `<｜DSML｜function_calls>` (DeepSeek V3.2).
    #[value(name = "deepseek_v32")]
    DeepseekV32,
    /// `functools[{"name": ..., "arguments": ...}, ...]` (Phi-4-mini,
    /// Phi-4-multimodal).
    #[value(name = "phi4_mini")]
    Phi4Mini,
    /// `<start_function_call>call:NAME{…}<end_function_call>` (FunctionGemma).
    #[value(name = "function_gemma")]
    FunctionGemma,
    /// gpt-oss Harmony (`to=functions.NAME` … `<|call|>`).
    #[value(name = "harmony")]
    Harmony,
    /// No tool-call parsing: the text stays content.
    #[value(name = "none")]
    None,
}

/// `--reasoning-parser`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningParserFlag {
    /// Chosen from the model directory.
    #[value(name = "auto")]
    Auto,
    /// `<think>…</think>` (Qwen3, Qwen3-VL Thinking, DeepSeek V3.1).
    #[value(name = "qwen3")]
    Qwen3,
    /// `<think>…</think>`, the answer always starting inside it (DeepSeek R1).
    #[value(name = "deepseek_r1")]
    DeepseekR1,
    /// `<think>…</think>` (GLM-4.5; the same parser as `qwen3`).
    #[value(name = "glm45")]
    Glm45,
    /// `◁think▷…◁/think▷` (Kimi-VL Thinking).
    #[value(name = "kimi")]
    Kimi,
    /// gpt-oss Harmony: the `analysis` channel.
    #[value(name = "harmony")]
    Harmony,
    /// No reasoning parsing.
    #[value(name = "none")]
    None,
}

/// The tool-call syntax a model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Qwen3Coder,
    Glm45,
    Llama3Json,
    Pythonic,
    Mistral,
    InternLm,
    KimiK2,
    DeepSeekV3,
    DeepSeekV32,
    Phi4Mini,
    FunctionGemma,
    /// Parsed by the Harmony machine on the reasoning side.
    Harmony,
}

impl ToolFormat {
    /// The format a flag names (`None` for `auto` and `none`).
    fn from_flag(flag: ToolParserFlag) -> Option<Self> {
        Some(match flag {
            ToolParserFlag::Auto | ToolParserFlag::None => return None,
            ToolParserFlag::Hermes => Self::Hermes,
            ToolParserFlag::Qwen3Coder => Self::Qwen3Coder,
            ToolParserFlag::Llama3Json => Self::Llama3Json,
            ToolParserFlag::Pythonic | ToolParserFlag::Gemma => Self::Pythonic,
            ToolParserFlag::Mistral => Self::Mistral,
            ToolParserFlag::Internlm => Self::InternLm,
            ToolParserFlag::KimiK2 => Self::KimiK2,
            ToolParserFlag::Glm45 => Self::Glm45,
            ToolParserFlag::DeepseekV3 => Self::DeepSeekV3,
            ToolParserFlag::DeepseekV32 => Self::DeepSeekV32,
            ToolParserFlag::Phi4Mini => Self::Phi4Mini,
            ToolParserFlag::FunctionGemma => Self::FunctionGemma,
            ToolParserFlag::Harmony => Self::Harmony,
        })
    }

    /// The special tokens its markers are made of.
    fn tokens(self) -> &'static [&'static str] {
        use iris_parsers as p;
        match self {
            Self::Hermes | Self::Qwen3Coder => p::tools::TOKENS,
            Self::Glm45 => p::glm45::TOKENS,
            Self::Llama3Json => p::llama3_json::TOKENS,
            Self::Pythonic => p::pythonic::TOKENS,
            Self::Mistral => p::mistral::TOKENS,
            Self::InternLm => p::internlm::TOKENS,
            Self::KimiK2 => p::kimi_k2::TOKENS,
            Self::DeepSeekV3 => p::deepseek_v3::TOKENS,
            Self::DeepSeekV32 => p::deepseek_v32::TOKENS,
            Self::Phi4Mini => p::phi4_mini::TOKENS,
            Self::FunctionGemma => p::function_gemma::TOKENS,
            Self::Harmony => p::harmony::TOKENS,
        }
    }
}

/// How a model marks its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// `<think>…</think>`; the answer starts inside it when the prompt
    /// ended by opening it (Qwen3, GLM-4.5, DeepSeek V3.1).
    Think,
    /// `<think>…</think>`, the answer always starting inside it (DeepSeek
    /// R1, whose older templates did not open it in the prompt).
    DeepSeekR1,
    /// `◁think▷…◁/think▷` (Kimi).
    Kimi,
    /// gpt-oss Harmony channels.
    Harmony,
}

impl ReasoningFormat {
    fn from_flag(flag: ReasoningParserFlag) -> Option<Self> {
        Some(match flag {
            ReasoningParserFlag::Auto | ReasoningParserFlag::None => return None,
            ReasoningParserFlag::Qwen3 | ReasoningParserFlag::Glm45 => Self::Think,
            ReasoningParserFlag::DeepseekR1 => Self::DeepSeekR1,
            ReasoningParserFlag::Kimi => Self::Kimi,
            ReasoningParserFlag::Harmony => Self::Harmony,
        })
    }

    /// The tags, for tagged reasoning.
    fn tags(self) -> Option<ThinkTags> {
        match self {
            Self::Think | Self::DeepSeekR1 => Some(THINK),
            Self::Kimi => Some(KIMI),
            Self::Harmony => None,
        }
    }

    fn tokens(self) -> Vec<&'static str> {
        match self.tags() {
            Some(tags) => vec![tags.open, tags.close],
            None => iris_parsers::harmony::TOKENS.to_vec(),
        }
    }
}

/// The parsers the served model gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputParsers {
    /// `None`: tool calls are never parsed out of free text.
    pub tools: Option<ToolFormat>,
    /// `None`: no reasoning is split off.
    pub reasoning: Option<ReasoningFormat>,
    /// The ids of the tool syntax's marker tokens, kept in the decoded
    /// text while tool calls are parsed (see [`Self::resolve_tokens`]).
    tool_token_ids: Arc<[u32]>,
    /// The same for the reasoning markers, kept whenever it is parsed.
    reasoning_token_ids: Arc<[u32]>,
}

impl OutputParsers {
    /// Resolves the flags against the model directory and its template
    /// (an explicit flag always wins; `auto` follows [`detect`]).
    pub fn choose(
        tools: ToolParserFlag,
        reasoning: ReasoningParserFlag,
        dir: &ModelDir,
        template: &str,
    ) -> Self {
        let clues = detect::Clues::new(dir, template);
        let tools = match tools {
            ToolParserFlag::Auto => detect::tools(&clues),
            flag => ToolFormat::from_flag(flag),
        };
        let reasoning = match reasoning {
            ReasoningParserFlag::Auto => detect::reasoning(&clues, tools),
            flag => ReasoningFormat::from_flag(flag),
        };
        Self {
            tools,
            reasoning,
            ..Self::default()
        }
    }

    /// Looks up the parsers' marker tokens in `tokenizer`: the special
    /// ones among them are then kept when answers are decoded (decoding
    /// drops special tokens otherwise, and several families write their
    /// markers as special tokens).
    pub fn resolve_tokens(mut self, tokenizer: &Tokenizer) -> Self {
        let ids = |names: &[&str]| -> Arc<[u32]> {
            names
                .iter()
                .filter_map(|n| tokenizer.token_to_id(n))
                .collect()
        };
        self.tool_token_ids = ids(self.tools.map(ToolFormat::tokens).unwrap_or_default());
        let reasoning = if self.harmony() {
            Some(ReasoningFormat::Harmony)
        } else {
            self.reasoning
        };
        self.reasoning_token_ids = ids(&reasoning.map(ReasoningFormat::tokens).unwrap_or_default());
        self
    }

    /// Whether the Harmony machine reads the answers.
    fn harmony(&self) -> bool {
        self.tools == Some(ToolFormat::Harmony) || self.reasoning == Some(ReasoningFormat::Harmony)
    }
}

/// What one request's output needs.
#[derive(Debug, Clone, Default)]
pub struct OutputPlan {
    tools: Option<ToolPlan>,
    reasoning: Option<ReasoningPlan>,
    /// Special token ids the decoded text keeps.
    kept_tokens: Vec<u32>,
}

#[derive(Debug, Clone)]
enum ToolPlan {
    Tagged(ToolSyntax),
    Json(Option<String>),
}

#[derive(Debug, Clone, Copy)]
enum ReasoningPlan {
    /// Tagged; the output starts inside the reasoning when `open`.
    Think { tags: ThinkTags, open: bool },
    /// Harmony; `calls`: messages to functions are tool calls.
    Harmony { calls: bool },
}

impl OutputPlan {
    /// Plans `request`'s output, and puts the `tool_choice` constraint on
    /// `sampling` unless it already has one (a `response_format` wins; the
    /// output is then not parsed for tool calls). `prompt` is the rendered
    /// prompt.
    pub fn new(
        parsers: &OutputParsers,
        request: &ChatCompletionRequest,
        sampling: &mut Sampling,
        prompt: &str,
    ) -> Self {
        let mut constrained = false;
        if let Some(constraint) = request.tool_constraint() {
            if sampling.constraint.is_some() {
                tracing::warn!(
                    "tool_choice asks for a tool call but response_format constrains the output: \
                     response_format wins and no tool call is parsed"
                );
            } else {
                sampling.constraint = Some(constraint);
                constrained = true;
            }
        }
        let output = request.tool_output(constrained);
        let tagged = matches!(output, ToolOutput::Tagged) && parsers.tools.is_some();
        let tools = match output {
            ToolOutput::None => None,
            ToolOutput::Json { named } => Some(ToolPlan::Json(named)),
            ToolOutput::Tagged => parsers
                .tools
                .filter(|f| *f != ToolFormat::Harmony)
                .map(|format| ToolPlan::Tagged(syntax(format, request))),
        };
        let reasoning = if parsers.harmony() {
            Some(ReasoningPlan::Harmony { calls: tagged })
        } else {
            parsers
                .reasoning
                .and_then(ReasoningFormat::tags)
                .map(|tags| ReasoningPlan::Think {
                    tags,
                    open: parsers.reasoning == Some(ReasoningFormat::DeepSeekR1)
                        || prompt.trim_end().ends_with(tags.open),
                })
        };
        let mut kept_tokens = Vec::new();
        if reasoning.is_some() {
            kept_tokens.extend_from_slice(&parsers.reasoning_token_ids);
        }
        if tagged {
            kept_tokens.extend_from_slice(&parsers.tool_token_ids);
        }
        kept_tokens.sort_unstable();
        kept_tokens.dedup();
        Self {
            tools,
            reasoning,
            kept_tokens,
        }
    }

    /// The parsers of one choice.
    pub fn shaper(&self) -> OutputShaper {
        let tools = self.tools.as_ref().map(|plan| match plan {
            ToolPlan::Tagged(syntax) => ToolCallParser::tagged(syntax.clone()),
            ToolPlan::Json(named) => ToolCallParser::json(named.clone()),
        });
        let reasoning = self.reasoning.map(|plan| match plan {
            ReasoningPlan::Think { tags, open } => ReasoningParser::think(tags, open),
            ReasoningPlan::Harmony { calls } => ReasoningParser::harmony(calls),
        });
        OutputShaper::new(reasoning, tools)
    }

    /// Special token ids the answer's decoded text keeps, because the
    /// parsers read them as markers.
    pub fn kept_tokens(&self) -> &[u32] {
        &self.kept_tokens
    }
}

/// The syntax for `format`, typed by the request's tools.
fn syntax(format: ToolFormat, request: &ChatCompletionRequest) -> ToolSyntax {
    let types = || {
        ParamTypes::from_schemas(
            request
                .active_tools()
                .iter()
                .map(|t| (t.function.name.as_str(), t.function.parameters.as_ref())),
        )
    };
    match format {
        ToolFormat::Hermes | ToolFormat::Harmony => ToolSyntax::Hermes,
        ToolFormat::Qwen3Coder => ToolSyntax::Qwen3Coder(types()),
        ToolFormat::Glm45 => ToolSyntax::Glm45(types()),
        ToolFormat::Llama3Json => ToolSyntax::Llama3Json,
        ToolFormat::Pythonic => ToolSyntax::Pythonic,
        ToolFormat::Mistral => ToolSyntax::Mistral,
        ToolFormat::InternLm => ToolSyntax::InternLm,
        ToolFormat::KimiK2 => ToolSyntax::KimiK2,
        ToolFormat::DeepSeekV3 => ToolSyntax::DeepSeekV3,
        ToolFormat::DeepSeekV32 => ToolSyntax::DeepSeekV32,
        ToolFormat::Phi4Mini => ToolSyntax::Phi4Mini,
        ToolFormat::FunctionGemma => ToolSyntax::FunctionGemma,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_openai::{parse_chat_request, Constraint};
    use iris_parsers::Piece;

    fn model_dir(name: &str) -> (tempfile::TempDir, ModelDir) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(name);
        iris_model::tiny::write_tiny_qwen2_vl(&path).unwrap();
        let dir = ModelDir::load(&path).unwrap();
        (tmp, dir)
    }

    #[test]
    fn parsers_are_chosen_from_the_template_and_the_name() {
        let (_t, tiny) = model_dir("tiny");
        let auto = |dir: &ModelDir, template: &str| {
            OutputParsers::choose(
                ToolParserFlag::Auto,
                ReasoningParserFlag::Auto,
                dir,
                template,
            )
        };
        let tiny_template = iris_model::tiny::CHAT_TEMPLATE;
        let tiny_parsers = auto(&tiny, tiny_template);
        assert_eq!(
            (tiny_parsers.tools, tiny_parsers.reasoning),
            (Some(ToolFormat::Hermes), None)
        );
        let coder = "{{ '<tool_call>\\n<function=' + name + '>' }}";
        assert_eq!(auto(&tiny, coder).tools, Some(ToolFormat::Qwen3Coder));
        let think = Some(ReasoningFormat::Think);
        assert_eq!(auto(&tiny, "{{ '<think>\\n' }}").reasoning, think);
        let (_t, thinking) = model_dir("Qwen3-VL-8B-Thinking");
        assert_eq!(auto(&thinking, tiny_template).reasoning, think);
        let forced = OutputParsers::choose(
            ToolParserFlag::None,
            ReasoningParserFlag::Qwen3,
            &tiny,
            tiny_template,
        );
        assert_eq!(
            (forced.tools, forced.reasoning),
            (None, Some(ReasoningFormat::Think))
        );
    }

    fn hermes() -> OutputParsers {
        OutputParsers {
            tools: Some(ToolFormat::Hermes),
            reasoning: Some(ReasoningFormat::Think),
            ..OutputParsers::default()
        }
    }

    fn request(extra: &str) -> ChatCompletionRequest {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],
            "tools":[{{"type":"function","function":{{"name":"f","parameters":{{"type":"object"}}}}}}]{extra}}}"#
        );
        parse_chat_request(body.as_bytes()).unwrap()
    }

    fn shaped(plan: &OutputPlan, text: &str) -> iris_parsers::Shaped {
        plan.shaper().shape(text)
    }

    /// A tokenizer whose only tokens are these special ones.
    fn special_tokenizer(tokens: &[&str]) -> Tokenizer {
        let mut tok = Tokenizer::new(tokenizers::models::wordlevel::WordLevel::default());
        let added: Vec<tokenizers::AddedToken> = tokens
            .iter()
            .map(|t| tokenizers::AddedToken::from(*t, true))
            .collect();
        tok.add_special_tokens(&added);
        tok
    }

    #[test]
    fn marker_tokens_are_kept_while_their_parser_runs() {
        let tok = special_tokenizer(&["[TOOL_CALLS]", "[ARGS]", "<think>", "</think>", "<s>"]);
        let id = |t: &str| tok.token_to_id(t).expect("token");
        let parsers = OutputParsers {
            tools: Some(ToolFormat::Mistral),
            reasoning: Some(ReasoningFormat::Think),
            ..OutputParsers::default()
        }
        .resolve_tokens(&tok);
        let req = request("");
        let plan = OutputPlan::new(&parsers, &req, &mut req.sampling(), "prompt");
        let mut kept = plan.kept_tokens().to_vec();
        kept.sort_unstable();
        let mut want = vec![
            id("[TOOL_CALLS]"),
            id("[ARGS]"),
            id("<think>"),
            id("</think>"),
        ];
        want.sort_unstable();
        assert_eq!(kept, want);
        // tool_choice none: only the reasoning markers.
        let none = request(r#","tool_choice":"none""#);
        let plan = OutputPlan::new(&parsers, &none, &mut none.sampling(), "prompt");
        let mut think = [id("<think>"), id("</think>")];
        think.sort_unstable();
        assert_eq!(plan.kept_tokens(), think);
    }

    #[test]
    fn function_gemma_keeps_its_escape_token_and_reads_its_calls() {
        let tok = special_tokenizer(&[
            "<start_function_call>",
            "<end_function_call>",
            "<escape>",
            "<end_of_turn>",
        ]);
        let id = |t: &str| tok.token_to_id(t).expect("token");
        let parsers = OutputParsers {
            tools: Some(ToolFormat::FunctionGemma),
            ..OutputParsers::default()
        }
        .resolve_tokens(&tok);
        let req = request("");
        let plan = OutputPlan::new(&parsers, &req, &mut req.sampling(), "prompt");
        let mut want = vec![
            id("<start_function_call>"),
            id("<end_function_call>"),
            id("<escape>"),
        ];
        want.sort_unstable();
        assert_eq!(plan.kept_tokens(), want);
        let out = shaped(
            &plan,
            "<start_function_call>call:f{a:<escape>x, y<escape>,b:2}<end_function_call>",
        );
        assert_eq!(out.tool_calls.len(), 1);
        assert_eq!(out.tool_calls[0].arguments, r#"{"a":"x, y","b":2}"#);
    }

    #[test]
    fn harmony_parses_reasoning_and_calls_from_its_channels() {
        let tok = special_tokenizer(iris_parsers::harmony::TOKENS);
        let parsers = OutputParsers {
            tools: Some(ToolFormat::Harmony),
            reasoning: None,
            ..OutputParsers::default()
        }
        .resolve_tokens(&tok);
        let req = request("");
        let plan = OutputPlan::new(&parsers, &req, &mut req.sampling(), "<|start|>assistant");
        assert_eq!(
            plan.kept_tokens().len(),
            iris_parsers::harmony::TOKENS.len()
        );
        let out = shaped(
            &plan,
            "<|channel|>analysis<|message|>Need f.<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":1}<|call|>",
        );
        assert_eq!(out.reasoning.as_deref(), Some("Need f."));
        assert_eq!(out.tool_calls.len(), 1);
        assert_eq!(out.tool_calls[0].arguments, r#"{"a":1}"#);
    }

    #[test]
    fn required_constrains_and_parses_json() {
        let req = request(r#","tool_choice":"required""#);
        let mut sampling = req.sampling();
        let plan = OutputPlan::new(&hermes(), &req, &mut sampling, "prompt");
        assert!(matches!(
            sampling.constraint,
            Some(Constraint::JsonSchema(_))
        ));
        let out = shaped(&plan, r#"[{"name":"f","parameters":{"a":1}}]"#);
        assert_eq!(out.tool_calls.len(), 1);
        assert_eq!(out.tool_calls[0].arguments, r#"{"a":1}"#);
    }

    #[test]
    fn a_response_format_constraint_wins() {
        let req = request(r#","tool_choice":"required""#);
        let mut sampling = req.sampling();
        let user = Constraint::JsonSchema("{}".into());
        sampling.constraint = Some(user.clone());
        let plan = OutputPlan::new(&hermes(), &req, &mut sampling, "prompt");
        assert_eq!(sampling.constraint, Some(user));
        let out = shaped(&plan, r#"[{"name":"f","parameters":{}}]"#);
        assert!(out.tool_calls.is_empty());
        assert_eq!(
            out.content.as_deref(),
            Some(r#"[{"name":"f","parameters":{}}]"#)
        );
    }

    #[test]
    fn auto_parses_tags_and_reasoning_opened_by_the_prompt() {
        let req = request("");
        let mut sampling = req.sampling();
        let plan = OutputPlan::new(
            &hermes(),
            &req,
            &mut sampling,
            "<|im_start|>assistant\n<think>\n",
        );
        assert_eq!(sampling.constraint, None);
        let mut shaper = plan.shaper();
        let mut pieces = shaper
            .push("hmm</think>\n\n<tool_call>\n{\"name\":\"f\",\"arguments\":{}}\n</tool_call>");
        pieces.extend(shaper.finish());
        assert_eq!(pieces[0], Piece::Reasoning("hmm".into()));
        assert!(matches!(&pieces[1], Piece::CallStart { name, .. } if name == "f"));
        // tool_choice none: tags stay text.
        let none = request(r#","tool_choice":"none""#);
        let plan = OutputPlan::new(&hermes(), &none, &mut none.sampling(), "prompt");
        let text = "<tool_call>\n{\"name\":\"f\"}\n</tool_call>";
        assert_eq!(shaped(&plan, text).content.as_deref(), Some(text));
    }
}
