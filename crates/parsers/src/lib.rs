//! iris-parsers: turning a model's generated text into the parts of an
//! OpenAI answer — `content`, `reasoning_content` and `tool_calls`.
//!
//! - [`reasoning::ReasoningParser`] splits reasoning from the answer:
//!   `<think>…</think>` (Qwen3 Thinking, DeepSeek R1/V3.1, GLM-4.5) or
//!   `◁think▷…◁/think▷` (Kimi); the output may start inside the reasoning
//!   when the prompt already opened it. gpt-oss's Harmony channels
//!   ([`harmony`]) carry reasoning, answer and tool calls at once.
//! - [`tools::ToolCallParser`] finds tool calls in the syntax of the
//!   model's family, one module each: [`hermes`] (Hermes/Qwen JSON),
//!   [`qwen3_coder`], [`glm45`], [`llama3_json`], [`pythonic`] (Llama
//!   3.2/4, Gemma 3), [`mistral`], [`internlm`], [`kimi_k2`],
//!   [`deepseek_v3`], [`deepseek_v32`] (DeepSeek V3.2's DSML),
//!   [`phi4_mini`] (Phi-4-mini, Phi-4-multimodal), [`function_gemma`] — all
//!   found in free text by one streaming machine ([`marked`]) — or a whole
//!   output that is plain JSON because decoding was constrained to the
//!   tool schemas ([`tools::JsonCalls`]).
//! - [`shaper::OutputShaper`] chains the two for one choice: push text
//!   deltas, get [`shaper::Piece`]s back; [`shaper::OutputShaper::shape`]
//!   does a whole text at once through the same machine.
//!
//! Every parser streams: text arrives in arbitrary deltas, a tag split
//! across deltas is held back until it is known to be a tag (then it is
//! consumed) or not (then it is released as text). Nothing here fails: a
//! tool call that does not parse is returned as content, as it was written.
//! Where the model writes a call's arguments as JSON, they are released in
//! fragments as they are decoded ([`args`]); a call that turns out
//! malformed after its start was released is closed with what was
//! released (logged), the one case where text is not given back.

#![forbid(unsafe_code)]

mod args;
pub mod deepseek_v3;
pub mod deepseek_v32;
pub mod function_gemma;
pub mod glm45;
pub mod harmony;
pub mod hermes;
pub mod internlm;
pub mod kimi_k2;
pub mod llama3_json;
pub mod marked;
pub mod mistral;
pub mod phi4_mini;
pub mod pythonic;
pub mod qwen3_coder;
pub mod reasoning;
mod scan;
pub mod shaper;
pub mod tools;

pub use reasoning::ReasoningParser;
pub use shaper::{OutputShaper, Piece, Shaped};
pub use tools::{new_call_id, ToolCall, ToolCallParser, ToolSyntax};
