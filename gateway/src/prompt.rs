//! From chat messages to prompt token ids: the model's chat template
//! (minijinja) and its tokenizer.
//!
//! Only the template's own markup makes special tokens: message text is
//! escaped before rendering ([`crate::usertext`]) and tokenized as plain
//! text after ([`crate::tokencache`]). The model's context is enforced
//! here too ([`crate::context`]): a text budget before rendering, the exact
//! token count after.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use iris_model::chat_template::ChatTemplate;
use iris_model::ModelDir;
use iris_openai::{ApiError, ChatCompletionRequest, ChatMessage, FallbackSyntax};
use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use iris_detok::DetokTables;

use crate::context::{self, ContextLimits};
use crate::output::ToolFormat;
use crate::tokencache::SegmentTokenizer;
use crate::usertext::Escaper;

pub struct Prompter {
    template: ChatTemplate,
    /// The template's source (parsers are chosen from its tags).
    source: String,
    /// The template reads `tools`; otherwise tools go in a fallback
    /// system block ([`iris_openai::tools_fallback`]).
    takes_tools: bool,
    /// The call syntax that block asks for: the tool parser's
    /// ([`Prompter::ask_for_calls_of`]).
    fallback: FallbackSyntax,
    /// The template reads them from the system message (Phi-4:
    /// [`iris_openai::system_message_tools`]).
    system_tools: bool,
    /// The template reads every content as a list of parts: string
    /// contents are given as one text part ([`iris_openai::content_as_parts`]).
    content_parts: bool,
    segments: SegmentTokenizer,
    /// What the answers' decoders share, built once for the tokenizer.
    detok: Arc<DetokTables>,
    escaper: Escaper,
    limits: ContextLimits,
    /// Variables HF templates expect besides the messages.
    extra: Value,
    /// Token ids below this are the model's (the config's `vocab_size`,
    /// or the tokenizer's size when larger).
    vocab_size: u32,
}

/// How to build prompts: the template, the segment cache, the context.
#[derive(Debug, Clone, Default)]
pub struct PromptOptions<'a> {
    /// A chat template file that wins over the model directory's own.
    pub template_file: Option<&'a Path>,
    /// Segments in the tokenizer cache (0: none).
    pub cache_entries: usize,
    /// Overrides the model's context length.
    pub context_length: Option<u32>,
}

impl Prompter {
    /// Loads the tokenizer and the chat template, and works out the
    /// context length and the text budget.
    pub fn load(dir: &ModelDir, options: &PromptOptions<'_>) -> anyhow::Result<Prompter> {
        let tokenizer = dir.load_tokenizer().context("cannot load the tokenizer")?;
        let source = match options.template_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read chat template {}", path.display()))?,
            None => dir
                .chat_template()
                .map(str::to_owned)
                .context("the model directory has no chat template; pass --chat-template FILE")?,
        };
        let template = ChatTemplate::new(&source).context("the chat template does not compile")?;
        let tc = &dir.tokenizer_config;
        let extra = serde_json::json!({
            "bos_token": tc.bos_token.clone().unwrap_or_default(),
            "eos_token": tc.eos_token.clone().unwrap_or_default(),
        });
        let limits = ContextLimits::new(
            context::context_length(dir, options.context_length)?,
            &tokenizer,
        );
        let escaper = Escaper::new(
            tokenizer
                .get_added_tokens_decoder()
                .values()
                .filter(|t| t.special)
                .map(|t| t.content.as_str()),
        )
        .map_err(anyhow::Error::msg)?;
        let vocab_size = dir
            .config
            .vocab_size
            .unwrap_or(0)
            .max(tokenizer.get_vocab_size(true) as u32);
        let segments =
            SegmentTokenizer::new(tokenizer, options.cache_entries).map_err(anyhow::Error::msg)?;
        let detok = Arc::new(DetokTables::new(segments.tokenizer().clone()));
        Ok(Prompter {
            template,
            detok,
            takes_tools: source.contains("tools"),
            fallback: FallbackSyntax::Hermes,
            system_tools: reads_system_message_tools(&source),
            content_parts: reads_content_as_parts(&source),
            source,
            segments,
            escaper,
            limits,
            extra,
            vocab_size,
        })
    }

    /// The model's vocabulary size: request token ids must be below it.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// The chat template's source.
    pub fn template_source(&self) -> &str {
        &self.source
    }

    /// Makes a fallback tools block (a template that takes no `tools`)
    /// ask for calls the `tools` parser reads: DeepSeek V3's markers for
    /// its parser (V3 / R1's fenced form when the template writes earlier
    /// calls so), Hermes calls otherwise.
    pub fn ask_for_calls_of(&mut self, tools: Option<ToolFormat>) {
        let fenced = self.source.contains("```json");
        self.fallback = match tools {
            Some(ToolFormat::DeepSeekV3) if fenced => FallbackSyntax::DeepSeekFenced,
            Some(ToolFormat::DeepSeekV3) => FallbackSyntax::DeepSeek,
            _ => FallbackSyntax::Hermes,
        };
    }

    /// The prompt of a chat request: its messages, its tools (through the
    /// template, or the fallback block when the template does not take
    /// them) and its `chat_template_kwargs`. Returns the token ids and the
    /// rendered text (whose end tells whether the template opened
    /// reasoning). The text is escaped ([`Prompter::render`]). Before
    /// tokenizing, each image's mark becomes its family's structure
    /// (`items`' expansions) and each Qwen3-VL video's its timestamps
    /// (`videos`).
    pub(crate) fn prompt_for(
        &self,
        request: &ChatCompletionRequest,
        items: &[crate::mm::pixels::ItemLayout],
        videos: &[Option<Vec<String>>],
    ) -> Result<(Vec<u32>, String), ApiError> {
        let mut messages = iris_openai::template_messages(&request.messages);
        let tools = request.template_tools();
        let mut vars = Map::new();
        for (key, value) in request.chat_template_kwargs.iter().flatten() {
            vars.insert(key.clone(), value.clone());
        }
        if self.takes_tools {
            if let Some(tools) = tools {
                if self.system_tools {
                    iris_openai::system_message_tools(&mut messages, &tools);
                }
                vars.insert("tools".into(), tools);
            }
        } else {
            iris_openai::tools_fallback(&mut messages, tools.as_ref(), self.fallback);
        }
        let mut vars = Value::Object(vars);
        self.escaper.escape_messages(&mut vars);
        if let (Value::Object(vars), Value::Object(base)) = (&mut vars, &self.extra) {
            for (key, value) in base {
                vars.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
        let ending = if request.continue_final_message {
            Ending::Continue
        } else {
            Ending::GenerationPrompt
        };
        let text = self.render_with(messages, &vars, ending)?;
        let text = crate::mm::items::expand_image_marks(text, items)?;
        let text = crate::mm::video::timestamp_videos(text, videos)?;
        let ids = self.encode(&text)?;
        Ok((ids, text))
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        self.segments.tokenizer()
    }

    /// The tokenizer's detokenization tables (shared by every decoder).
    pub fn detok(&self) -> &Arc<DetokTables> {
        &self.detok
    }

    /// The context length and text budget requests are checked against.
    pub fn limits(&self) -> &ContextLimits {
        &self.limits
    }

    /// Token ids of the prompt for `messages`. Check the text budget
    /// first ([`ContextLimits::check_text`]), and the exact count, image
    /// tokens included, after ([`ContextLimits::check_tokens`]).
    pub fn prompt_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ApiError> {
        self.conversation_ids(messages, true)
    }

    /// Token ids of `messages` as [`Prompter::prompt_ids`], with or
    /// without the generation prompt (`POST /v1/tokenize`).
    pub fn conversation_ids(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ApiError> {
        let ending = if add_generation_prompt {
            Ending::GenerationPrompt
        } else {
            Ending::Closed
        };
        let text = self.render_with(
            iris_openai::template_messages(messages),
            &self.extra,
            ending,
        )?;
        self.encode(&text)
    }

    /// Renders `messages` (HF message dicts) with the generation prompt.
    /// Special-token strings in message text come out escaped, so the
    /// result is for [`Prompter::encode`], not for reading.
    pub fn render(&self, messages: Value) -> Result<String, ApiError> {
        self.render_with(messages, &self.extra, Ending::GenerationPrompt)
    }

    /// [`Prompter::render`] with the template variables `vars` (already
    /// escaped where they come from the client), ending as asked.
    fn render_with(
        &self,
        mut messages: Value,
        vars: &Value,
        ending: Ending,
    ) -> Result<String, ApiError> {
        if self.content_parts {
            iris_openai::content_as_parts(&mut messages);
        }
        self.escaper.escape_messages(&mut messages);
        let text = self
            .template
            .render(&messages, ending == Ending::GenerationPrompt, Some(vars))
            .map_err(|e| {
                ApiError::bad_request(format!("the chat template rejected these messages: {e}"))
            })?;
        match ending {
            Ending::Continue => continue_final_message(text, &messages),
            Ending::GenerationPrompt | Ending::Closed => Ok(text),
        }
    }

    /// Token ids of a prompt from [`Prompter::render`] (the template already
    /// placed the special tokens, so none are added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.segments
            .encode(text)
            .map_err(|e| ApiError::internal(format!("tokenization failed: {e}")))
    }

    /// (hits, misses) of the segment cache.
    pub fn cache_stats(&self) -> (u64, u64) {
        self.segments.stats()
    }
}

/// Whether `source` reads a message's `tools` (Phi-4-mini's and
/// Phi-4-multimodal's templates list the tools of the system message).
fn reads_system_message_tools(source: &str) -> bool {
    ["message['tools']", "message[\"tools\"]", "message.tools"]
        .iter()
        .any(|m| source.contains(m))
}

/// Whether `source` reads every message's content as a list of parts: it
/// loops over `message['content']` and never tests a content for being a
/// string (LLaVA's, LLaVA-OneVision's and SmolVLM's templates). Such a
/// template writes nothing of a string content: the system message,
/// a plain-text turn, the tools fallback's blocks would be lost.
fn reads_content_as_parts(source: &str) -> bool {
    const LOOPS: [&str; 3] = [
        "in message['content']",
        "in message[\"content\"]",
        "in message.content",
    ];
    const STRING_TESTS: [&str; 6] = [
        "content is string",
        "content'] is string",
        "content\"] is string",
        "content is not string",
        "content'] is not string",
        "content\"] is not string",
    ];
    LOOPS.iter().any(|m| source.contains(m)) && !STRING_TESTS.iter().any(|t| source.contains(t))
}

/// How a rendered conversation ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// With the opening of a new assistant turn (the template's generation
    /// prompt): the answer is that turn.
    GenerationPrompt,
    /// With the last message closed, nothing after it (`/v1/tokenize`
    /// with `add_generation_prompt: false`).
    Closed,
    /// Inside the last message, right after its text: the answer continues
    /// it (an assistant prefill; `continue_final_message` in `transformers`).
    Continue,
}

/// `text` (the conversation rendered without the generation prompt) cut
/// right after the final message's text, so the model continues that
/// message; the text is its string content or its last text part
/// (`messages` as rendered, special tokens escaped). A 400 when the
/// template does not write that text as it is.
fn continue_final_message(text: String, messages: &Value) -> Result<String, ApiError> {
    let last = messages.as_array().and_then(|m| m.last());
    let content = last.and_then(|m| m.get("content"));
    let final_text = match content {
        Some(Value::String(text)) => Some(text.as_str()),
        Some(Value::Array(parts)) => parts
            .iter()
            .rev()
            .find(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .and_then(|p| p.get("text").and_then(Value::as_str)),
        _ => None,
    };
    let wanted = final_text.map(str::trim).unwrap_or_default();
    let cut = (!wanted.is_empty())
        .then(|| text.rfind(wanted))
        .flatten()
        .ok_or_else(|| {
            ApiError::bad_request(
                "the chat template does not write the final assistant message's text as it is, so it cannot be continued",
            )
        })?;
    let mut text = text;
    text.truncate(cut + wanted.len());
    Ok(text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_continued_message_ends_right_after_its_text() {
        let rendered =
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nMy answer is<|im_end|>\n";
        let messages = json!([{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": "My answer is"}]);
        assert_eq!(
            continue_final_message(rendered.to_owned(), &messages).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nMy answer is"
        );
        // Parts: the last text part is where the prompt ends.
        let parts = json!([{"role": "assistant", "content": [
            {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]);
        assert_eq!(
            continue_final_message("A: one two</s>".to_owned(), &parts).unwrap(),
            "A: one two"
        );
        // A template that rewrites the text cannot be continued.
        let missing = continue_final_message("A: ONE</s>".to_owned(), &parts).unwrap_err();
        assert_eq!(missing.status, 400);
    }

    /// DeepSeek's own templates (V3.1's and R1's, from llama.cpp) write
    /// earlier calls and results in DeepSeek's markers and take no
    /// `tools`: `auto` picks the deepseek_v3 parser, and the fallback block
    /// lists the tools as DeepSeek's models read them and asks for calls in
    /// the form the template writes, which the parser reads.
    #[test]
    fn deepseek_templates_get_tools_in_their_own_syntax() {
        use crate::output::{OutputParsers, ReasoningParserFlag, ToolParserFlag};
        let cases = [
            (
                include_str!("../tests/data/templates/deepseek-v3.1.jinja"),
                "<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜>",
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\":\"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                "<｜tool▁output▁begin｜>18 C<｜tool▁output▁end｜>",
            ),
            (
                include_str!("../tests/data/templates/deepseek-r1-distill-qwen.jinja"),
                "<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGUMENTS\n```<｜tool▁call▁end｜>",
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\":\"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18 C<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
            ),
        ];
        for (template, asked, earlier_call, result) in cases {
            let tmp = tempfile::tempdir().expect("tempdir");
            iris_model::tiny::write_tiny_qwen2_vl(tmp.path()).expect("tiny model");
            let file = tmp.path().join("deepseek.jinja");
            std::fs::write(&file, template).expect("template");
            let dir = ModelDir::load(tmp.path()).expect("model dir");
            let options = PromptOptions {
                template_file: Some(&file),
                ..PromptOptions::default()
            };
            let mut prompter = Prompter::load(&dir, &options).expect("prompter");
            assert!(!prompter.takes_tools);
            let parsers = OutputParsers::choose(
                ToolParserFlag::Auto,
                ReasoningParserFlag::Auto,
                &dir,
                prompter.template_source(),
            );
            assert_eq!(parsers.tools, Some(ToolFormat::DeepSeekV3));
            prompter.ask_for_calls_of(parsers.tools);
            let request =
                iris_openai::parse_chat_request(DEEPSEEK_TOOLS_CHAT.as_bytes()).expect("request");
            let (_, text) = prompter.prompt_for(&request, &[], &[]).expect("prompt");
            let system = "Be brief.\n\n## Tools\nYou have access to the following tools:\n\n\
                          ### get_weather\nDescription: The weather of a city.\n\n\
                          Parameters: {\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}\n";
            assert!(text.contains(system), "{text}");
            assert!(
                text.contains(&format!(
                    "<｜tool▁calls▁begin｜>{asked}<｜tool▁calls▁end｜>"
                )),
                "{text}"
            );
            assert!(text.contains(earlier_call), "{text}");
            assert!(
                !text.contains("<｜end▁of▁sentence｜><｜Assistant｜><｜end▁of▁sentence｜>"),
                "a calling message's null content writes no empty turn: {text}"
            );
            assert!(text.contains(result), "{text}");
            assert!(!text.contains("<tool_call>"), "no Hermes syntax: {text}");
            // A parser forced to another syntax is asked for in Hermes'.
            prompter.ask_for_calls_of(Some(ToolFormat::Hermes));
            let (_, hermes) = prompter.prompt_for(&request, &[], &[]).expect("prompt");
            assert!(
                hermes.contains("<tool_call>") && !hermes.contains("## Tools"),
                "{hermes}"
            );
        }
    }

    const DEEPSEEK_TOOLS_CHAT: &str = r#"{"model": "m",
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "description": "The weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]}"#;

    #[test]
    fn phi4_lists_the_tools_between_its_tool_tags() {
        use iris_model::tiny::{write_tiny_model, Family};
        let tmp = tempfile::tempdir().expect("tempdir");
        write_tiny_model(tmp.path(), Family::Phi4Multimodal).expect("tiny model");
        let dir = ModelDir::load(tmp.path()).expect("model dir");
        let prompter = Prompter::load(&dir, &PromptOptions::default()).expect("prompter");
        assert!(prompter.system_tools);
        let request = iris_openai::parse_chat_request(
            br#"{"model": "m", "messages": [{"role": "user", "content": "Weather?"}],
                "tools": [{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}"#,
        )
        .expect("request");
        let (_, text) = prompter.prompt_for(&request, &[], &[]).expect("prompt");
        let listed = r#"[{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]"#;
        assert!(
            text.starts_with(&format!("<|system|><|tool|>{listed}<|/tool|>")),
            "{text}"
        );
        assert!(text.contains("<|user|>Weather?<|end|>"), "{text}");
        assert!(!reads_system_message_tools("{{ tools | tojson }}"));
    }

    /// A tools chat: a system message, a question with an image, the
    /// model's call and the tool's answer.
    const TOOLS_CHAT: &str = r#"{"model": "m",
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather here?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]}"#;

    /// The prompt text `family`'s tiny model gets for [`TOOLS_CHAT`] (the
    /// image's mark not expanded: no items), and the fallback's system
    /// text after "Be brief.".
    fn tools_chat_prompt(family: iris_model::tiny::Family) -> (String, String) {
        let tmp = tempfile::tempdir().expect("tempdir");
        iris_model::tiny::write_tiny_model(tmp.path(), family).expect("tiny model");
        let dir = ModelDir::load(tmp.path()).expect("model dir");
        let prompter = Prompter::load(&dir, &PromptOptions::default()).expect("prompter");
        assert!(!prompter.takes_tools, "{family:?}");
        let request = iris_openai::parse_chat_request(TOOLS_CHAT.as_bytes()).expect("request");
        let (_, text) = prompter.prompt_for(&request, &[], &[]).expect("prompt");
        let mut system = json!([{"role": "system", "content": "Be brief."}]);
        iris_openai::tools_fallback(
            &mut system,
            request.template_tools().as_ref(),
            FallbackSyntax::Hermes,
        );
        let system = system[0]["content"]
            .as_str()
            .expect("system text")
            .to_owned();
        (text, system)
    }

    const CALL: &str =
        "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>";
    const RESPONSE: &str = "<tool_response>\n18 C\n</tool_response>";

    /// The templates of LLaVA, LLaVA-OneVision and SmolVLM read every
    /// content as parts, InternVL's strings too: each gets the tools
    /// block, the call and the tool's answer as text, the image's mark
    /// where the template writes it.
    #[test]
    fn tools_chats_on_templates_without_tools() {
        use iris_model::tiny::Family;
        let (text, system) = tools_chat_prompt(Family::Llava);
        assert!(system.starts_with("Be brief.\n\n# Tools\n"), "{system}");
        assert_eq!(
            text,
            format!(
                "{system} USER: <image>\nWeather here? ASSISTANT: {CALL} USER: {RESPONSE} ASSISTANT:"
            )
        );
        let (text, system) = tools_chat_prompt(Family::LlavaNext);
        assert!(
            text.starts_with(&format!("{system} USER: <image>\n")),
            "{text}"
        );
        let (text, system) = tools_chat_prompt(Family::LlavaOnevision);
        assert_eq!(
            text,
            format!(
                "<|im_start|>system \n{system}<|im_end|><|im_start|>user <image>\nWeather here?<|im_end|>\
                 <|im_start|>assistant \n{CALL}<|im_end|><|im_start|>user \n{RESPONSE}<|im_end|>\
                 <|im_start|>assistant\n"
            )
        );
        let (text, system) = tools_chat_prompt(Family::Idefics3);
        assert_eq!(
            text,
            format!(
                "<|im_start|>System: {system}<end_of_utterance>\nUser: Weather here?<image><end_of_utterance>\n\
                 Assistant: {CALL}<end_of_utterance>\nUser: {RESPONSE}<end_of_utterance>\nAssistant:"
            )
        );
        let (text, system) = tools_chat_prompt(Family::Internvl);
        assert_eq!(
            text,
            format!(
                "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWeather here?<IMG_CONTEXT>\n<|im_end|>\n\
                 <|im_start|>assistant\n{CALL}<|im_end|>\n<|im_start|>user\n{RESPONSE}<|im_end|>\n\
                 <|im_start|>assistant\n"
            )
        );
    }

    #[test]
    fn templates_that_read_contents_as_parts_only() {
        use iris_model::tiny::Family;
        let template = |family: Family| family.spec().expect("spec").template;
        for family in [Family::Llava, Family::LlavaOnevision, Family::Idefics3] {
            assert!(reads_content_as_parts(&template(family)), "{family:?}");
        }
        // These test for a string first.
        for family in [
            Family::Internvl,
            Family::Gemma3,
            Family::Pixtral,
            Family::Llama4,
        ] {
            assert!(!reads_content_as_parts(&template(family)), "{family:?}");
        }
        assert!(!reads_content_as_parts("{{ message['content'] }}"));
    }
}
