//! iris-parsers: turning a model's generated text into the parts of an
//! OpenAI answer — `content`, `reasoning_content` and `tool_calls`.
//!
//! - [`reasoning::ReasoningParser`] splits `<think>…</think>` reasoning
//!   (Qwen3 Thinking) from the answer; the output may start inside the
//!   reasoning when the prompt already opened `<think>`.
//! - [`tools::ToolCallParser`] finds tool calls: `<tool_call>` blocks whose
//!   body is Hermes/Qwen JSON ([`hermes`]) or Qwen3-Coder XML
//!   ([`qwen3_coder`]), or a whole output that is plain JSON because
//!   decoding was constrained to the tool schemas ([`tools::JsonCalls`]).
//! - [`shaper::OutputShaper`] chains the two for one choice: push text
//!   deltas, get [`shaper::Piece`]s back; [`shaper::OutputShaper::shape`]
//!   does a whole text at once through the same machine.
//!
//! Every parser streams: text arrives in arbitrary deltas, a tag split
//! across deltas is held back until it is known to be a tag (then it is
//! consumed) or not (then it is released as text). Nothing here fails: a
//! tool call that does not parse is returned as content, as it was written.

#![forbid(unsafe_code)]

pub mod hermes;
pub mod qwen3_coder;
pub mod reasoning;
mod scan;
pub mod shaper;
pub mod tools;

pub use reasoning::ReasoningParser;
pub use shaper::{OutputShaper, Piece, Shaped};
pub use tools::{new_call_id, ToolCall, ToolCallParser, ToolSyntax};
