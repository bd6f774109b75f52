//! How generated text becomes `content`, `reasoning_content` and
//! `tool_calls`: which parsers a model gets ([`OutputParsers`], chosen at
//! start-up from the model directory or the `--tool-call-parser` and
//! `--reasoning-parser` flags), and what one request needs
//! ([`OutputPlan`], which builds one [`OutputShaper`] per choice).
//!
//! Detection (`auto`):
//! - tool calls: Qwen3-Coder's XML form when the chat template writes
//!   `<function=` or the model is a Qwen3 Coder (`model_type` or
//!   `architectures` starting with `qwen3` and the directory name holding
//!   `coder`); the Hermes/Qwen JSON form otherwise — it is what Qwen
//!   templates ask for, and what the fallback tools block asks for when a
//!   template does not take tools.
//! - reasoning: `<think>` parsing when the chat template mentions
//!   `<think>` or the directory name holds `thinking`.

use iris_model::ModelDir;
use iris_openai::{ChatCompletionRequest, Sampling, ToolOutput};
use iris_parsers::qwen3_coder::ParamTypes;
use iris_parsers::{OutputShaper, ReasoningParser, ToolCallParser, ToolSyntax};

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
    /// `<think>…</think>` (Qwen3, Qwen3-VL Thinking).
    #[value(name = "qwen3")]
    Qwen3,
    /// No reasoning parsing.
    #[value(name = "none")]
    None,
}

/// The tool-call syntax a model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Qwen3Coder,
}

/// The parsers the served model gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputParsers {
    /// `None`: tool calls are never parsed out of free text.
    pub tools: Option<ToolFormat>,
    /// `<think>` reasoning is split off.
    pub reasoning: bool,
}

impl OutputParsers {
    /// Resolves the flags against the model directory and its template.
    pub fn choose(
        tools: ToolParserFlag,
        reasoning: ReasoningParserFlag,
        dir: &ModelDir,
        template: &str,
    ) -> Self {
        let name = dir
            .root
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        let tools = match tools {
            ToolParserFlag::None => None,
            ToolParserFlag::Hermes => Some(ToolFormat::Hermes),
            ToolParserFlag::Qwen3Coder => Some(ToolFormat::Qwen3Coder),
            ToolParserFlag::Auto if template.contains("<function=") => Some(ToolFormat::Qwen3Coder),
            ToolParserFlag::Auto if is_qwen3(dir) && name.contains("coder") => {
                Some(ToolFormat::Qwen3Coder)
            }
            ToolParserFlag::Auto => Some(ToolFormat::Hermes),
        };
        let reasoning = match reasoning {
            ReasoningParserFlag::None => false,
            ReasoningParserFlag::Qwen3 => true,
            ReasoningParserFlag::Auto => template.contains("<think>") || name.contains("thinking"),
        };
        Self { tools, reasoning }
    }
}

/// A Qwen3-family model (`model_type` or an architecture).
fn is_qwen3(dir: &ModelDir) -> bool {
    let config = &dir.config;
    std::iter::once(config.model_type.as_str())
        .chain(config.architectures.iter().map(String::as_str))
        .any(|s| s.to_lowercase().starts_with("qwen3"))
}

/// What one request's output needs.
#[derive(Debug, Clone, Default)]
pub struct OutputPlan {
    tools: Option<ToolPlan>,
    /// `Some(in_reasoning)`: reasoning is parsed, and the output starts
    /// inside it when the prompt ended by opening `<think>`.
    reasoning: Option<bool>,
}

#[derive(Debug, Clone)]
enum ToolPlan {
    Tagged(ToolSyntax),
    Json(Option<String>),
}

impl OutputPlan {
    /// Plans `request`'s output, and puts the `tool_choice` constraint on
    /// `sampling` unless it already has one (a `response_format` wins; the
    /// output is then not parsed for tool calls). `prompt` is the rendered
    /// prompt.
    pub fn new(
        parsers: OutputParsers,
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
        let tools = match request.tool_output(constrained) {
            ToolOutput::None => None,
            ToolOutput::Json { named } => Some(ToolPlan::Json(named)),
            ToolOutput::Tagged => parsers
                .tools
                .map(|format| ToolPlan::Tagged(syntax(format, request))),
        };
        let reasoning = parsers.reasoning.then(|| {
            prompt
                .trim_end()
                .ends_with(iris_parsers::reasoning::THINK_OPEN)
        });
        Self { tools, reasoning }
    }

    /// The parsers of one choice.
    pub fn shaper(&self) -> OutputShaper {
        let tools = self.tools.as_ref().map(|plan| match plan {
            ToolPlan::Tagged(syntax) => ToolCallParser::tagged(syntax.clone()),
            ToolPlan::Json(named) => ToolCallParser::json(named.clone()),
        });
        OutputShaper::new(self.reasoning.map(ReasoningParser::new), tools)
    }
}

/// The block syntax for `format`, typed by the request's tools.
fn syntax(format: ToolFormat, request: &ChatCompletionRequest) -> ToolSyntax {
    match format {
        ToolFormat::Hermes => ToolSyntax::Hermes,
        ToolFormat::Qwen3Coder => ToolSyntax::Qwen3Coder(ParamTypes::from_schemas(
            request
                .active_tools()
                .iter()
                .map(|t| (t.function.name.as_str(), t.function.parameters.as_ref())),
        )),
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
        assert_eq!(
            auto(&tiny, tiny_template),
            OutputParsers {
                tools: Some(ToolFormat::Hermes),
                reasoning: false
            }
        );
        let coder = "{{ '<tool_call>\\n<function=' + name + '>' }}";
        assert_eq!(auto(&tiny, coder).tools, Some(ToolFormat::Qwen3Coder));
        assert!(auto(&tiny, "{{ '<think>\\n' }}").reasoning);
        let (_t, thinking) = model_dir("Qwen3-VL-8B-Thinking");
        assert!(auto(&thinking, tiny_template).reasoning);
        let forced = OutputParsers::choose(
            ToolParserFlag::None,
            ReasoningParserFlag::Qwen3,
            &tiny,
            tiny_template,
        );
        assert_eq!(
            forced,
            OutputParsers {
                tools: None,
                reasoning: true
            }
        );
    }

    const HERMES: OutputParsers = OutputParsers {
        tools: Some(ToolFormat::Hermes),
        reasoning: true,
    };

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

    #[test]
    fn required_constrains_and_parses_json() {
        let req = request(r#","tool_choice":"required""#);
        let mut sampling = req.sampling();
        let plan = OutputPlan::new(HERMES, &req, &mut sampling, "prompt");
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
        let plan = OutputPlan::new(HERMES, &req, &mut sampling, "prompt");
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
            HERMES,
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
        assert!(matches!(&pieces[1], Piece::ToolCall(c) if c.name == "f"));
        // tool_choice none: tags stay text.
        let none = request(r#","tool_choice":"none""#);
        let plan = OutputPlan::new(HERMES, &none, &mut none.sampling(), "prompt");
        let text = "<tool_call>\n{\"name\":\"f\"}\n</tool_call>";
        assert_eq!(shaped(&plan, text).content.as_deref(), Some(text));
    }
}
