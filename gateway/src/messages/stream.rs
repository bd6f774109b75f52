//! Streaming answers as the Messages API's server-sent events
//! ([`crate::http::sse`] runs the stream):
//!
//! - `message_start` (the message with empty content and the prompt's
//!   usage), then `ping`;
//! - per content block, in order: `content_block_start`, its deltas
//!   (`text_delta`, `thinking_delta`, or a tool call's `input_json_delta`s,
//!   one per fragment of its arguments as the shaper releases them) and
//!   `content_block_stop`. A text block opens with its first text, a
//!   `tool_use` block (its `input` empty) when the call starts; text and
//!   reasoning alternate blocks as the output shaper releases them;
//! - `message_delta` (`stop_reason`, `stop_sequence`, the final usage) and
//!   `message_stop`.
//!
//! A failure after the start is an `error` event; nothing follows it
//! (there is no `[DONE]` line in this API). Dropping the [`Generation`]
//! (the client left) aborts the workers.

use std::sync::Arc;

use axum::response::Response;
use bytes::BytesMut;
use iris_openai::ApiError;
use iris_parsers::{OutputShaper, Piece};
use iris_proto::scheduler::generate_response::Response as Reply;
use serde_json::{json, Value};

use super::errors::{write_error_event, write_event};
use super::text::MessageText;
use super::{message_text, usage, StopReason};
use crate::http::errors::stream_ended;
use crate::http::replies;
use crate::http::sse::{self, Events};
use crate::http::{Failure, Ledger};
use crate::metrics::Outcome;
use crate::request::ReadyConversation;
use crate::router::Generation;
use crate::server::AppState;

pub async fn respond(
    state: Arc<AppState>,
    ledger: Ledger,
    mut prepared: ReadyConversation,
) -> Response {
    let (id, prompt_tokens) = (ledger.id.clone(), ledger.prompt_tokens);
    let start = async move {
        let generation = prepared.start().await?;
        let writer = BlockWriter::new(id, prepared.served.name.clone(), prompt_tokens);
        Ok(MessageEvents {
            text: message_text(&prepared),
            shaper: prepared.output.shaper(),
            generation,
            writer,
            completed: false,
        })
    };
    sse::respond(state, ledger, start).await
}

/// The kind of block open in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
    ToolUse,
}

/// Writes the events of one message: its blocks, opened and closed in
/// order, and its start and end.
struct BlockWriter {
    id: String,
    model: String,
    prompt_tokens: u32,
    /// Prompt tokens the worker served from its prefix cache.
    cached_tokens: u32,
    /// The block open now.
    open: Option<Open>,
    /// Blocks started (the next block's index).
    blocks: u32,
    /// Tool calls written.
    calls: u32,
}

impl BlockWriter {
    fn new(id: String, model: String, prompt_tokens: u32) -> BlockWriter {
        BlockWriter {
            id,
            model,
            prompt_tokens,
            cached_tokens: 0,
            open: None,
            blocks: 0,
            calls: 0,
        }
    }

    /// `message_start` and a `ping`.
    fn start(&self, out: &mut BytesMut) {
        let message = json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": usage(self.prompt_tokens, self.cached_tokens, 0),
        });
        write_event(
            out,
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
        write_event(out, "ping", &json!({"type": "ping"}));
    }

    /// Writes one shaped piece of the answer.
    fn piece(&mut self, out: &mut BytesMut, piece: Piece) {
        match piece {
            Piece::Content(text) => self.delta(out, Open::Text, &text),
            Piece::Reasoning(text) => self.delta(out, Open::Thinking, &text),
            Piece::CallStart { id, name, .. } => {
                self.close(out);
                // The input arrives as deltas; the block starts empty.
                let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                self.begin(out, block);
                self.open = Some(Open::ToolUse);
                self.calls += 1;
            }
            Piece::CallArgs(fragment) => {
                if self.open == Some(Open::ToolUse) && !fragment.is_empty() {
                    let delta = json!({"type": "input_json_delta", "partial_json": fragment});
                    self.write_delta(out, delta);
                }
            }
            Piece::CallEnd => {
                if self.open == Some(Open::ToolUse) {
                    self.close(out);
                }
            }
        }
    }

    /// A `content_block_delta` of the open block.
    fn write_delta(&self, out: &mut BytesMut, delta: Value) {
        let index = self.blocks - 1;
        write_event(
            out,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        );
    }

    /// Text of a `text` or `thinking` block, opening it when another
    /// block (or none) is open.
    fn delta(&mut self, out: &mut BytesMut, kind: Open, text: &str) {
        if text.is_empty() {
            return;
        }
        if self.open != Some(kind) {
            self.close(out);
            let block = match kind {
                Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            self.begin(out, block);
            self.open = Some(kind);
        }
        let delta = match kind {
            Open::Thinking => json!({"type": "thinking_delta", "thinking": text}),
            _ => json!({"type": "text_delta", "text": text}),
        };
        self.write_delta(out, delta);
    }

    /// `content_block_start` of the next block; its index.
    fn begin(&mut self, out: &mut BytesMut, block: Value) -> u32 {
        let index = self.blocks;
        self.blocks += 1;
        write_event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        index
    }

    /// `content_block_stop` of the open block, if any.
    fn close(&mut self, out: &mut BytesMut) {
        if self.open.take().is_some() {
            let index = self.blocks - 1;
            write_event(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            );
        }
    }

    /// The open block's stop, `message_delta` and `message_stop`.
    fn end(&mut self, out: &mut BytesMut, reason: StopReason, output_tokens: u32) {
        self.close(out);
        let reason = reason.with_calls(self.calls > 0);
        let delta = json!({"stop_reason": reason.as_str(), "stop_sequence": reason.sequence()});
        let usage = usage(self.prompt_tokens, self.cached_tokens, output_tokens);
        write_event(
            out,
            "message_delta",
            &json!({"type": "message_delta", "delta": delta, "usage": usage}),
        );
        write_event(out, "message_stop", &json!({"type": "message_stop"}));
    }
}

/// The Messages endpoint's side of one SSE answer.
struct MessageEvents {
    generation: Generation,
    text: MessageText,
    /// Splits reasoning and tool calls out of the text.
    shaper: OutputShaper,
    writer: BlockWriter,
    /// The worker sent its GenerateComplete.
    completed: bool,
}

impl MessageEvents {
    /// Writes text that became visible: as it is, or through the shaper.
    fn visible(
        &mut self,
        out: &mut BytesMut,
        text: Result<String, ApiError>,
    ) -> Result<(), Failure> {
        let text = text.map_err(|error| (error, Outcome::UpstreamError))?;
        if text.is_empty() {
            return Ok(());
        }
        if self.shaper.is_passthrough() {
            self.writer.piece(out, Piece::Content(text));
        } else {
            for piece in self.shaper.push(&text) {
                self.writer.piece(out, piece);
            }
        }
        Ok(())
    }
}

impl Events for MessageEvents {
    type Event = Option<Reply>;

    fn open(&mut self, out: &mut BytesMut) {
        self.writer.start(out);
    }

    async fn next(&mut self) -> Option<Result<Self::Event, Failure>> {
        replies::next_reply(&mut self.generation).await
    }

    fn carries_tokens(event: &Self::Event) -> bool {
        replies::carries_tokens(event)
    }

    fn event(&mut self, out: &mut BytesMut, event: Self::Event) -> Result<bool, Failure> {
        match event {
            Some(Reply::Chunk(chunk)) => {
                self.writer.cached_tokens = self.writer.cached_tokens.max(chunk.cached_tokens);
                let text = self.text.push_chunk(&chunk.token_ids);
                self.visible(out, text)?;
                Ok(self.text.finish.is_some())
            }
            Some(Reply::Complete(complete)) => {
                if complete.finish_reason == "abort" {
                    let error = ApiError::bad_gateway("the worker aborted the request");
                    return Err((error, Outcome::UpstreamError));
                }
                self.completed = true;
                self.writer.cached_tokens = self.writer.cached_tokens.max(complete.cached_tokens);
                let text = self.text.complete(&complete);
                self.visible(out, text)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn exhausted(&mut self) -> Result<(), Failure> {
        let worker = self.generation.worker.url.to_string();
        Err((stream_ended(&worker), Outcome::UpstreamError))
    }

    fn finish(&mut self, out: &mut BytesMut) {
        if self.completed {
            self.generation.finish();
        } else {
            self.generation.abort("stop sequence matched");
        }
        for piece in self.shaper.finish() {
            self.writer.piece(out, piece);
        }
        let reason = self.text.finish.clone().unwrap_or(StopReason::EndTurn);
        self.writer.end(out, reason, self.text.completion_tokens);
    }

    fn abort(&mut self, reason: &str) {
        self.generation.abort(reason);
    }

    fn completion_tokens(&self) -> u32 {
        self.text.completion_tokens
    }

    fn migrations(&self) -> u32 {
        self.generation.migrations()
    }

    fn write_error(&mut self, out: &mut BytesMut, error: &ApiError) {
        write_error_event(out, error);
    }

    fn write_done(&self, _out: &mut BytesMut) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events written, as (name, data) pairs.
    fn events(out: &BytesMut) -> Vec<(String, Value)> {
        let text = std::str::from_utf8(out).expect("utf-8");
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').expect("two lines");
                let name = name.strip_prefix("event: ").expect("event line");
                let data = data.strip_prefix("data: ").expect("data line");
                let data: Value = serde_json::from_str(data).expect("json");
                assert_eq!(data["type"], name, "the data's type is the event's name");
                (name.to_owned(), data)
            })
            .collect()
    }

    fn call() -> iris_parsers::ToolCall {
        iris_parsers::ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        }
    }

    fn whole_call(writer: &mut BlockWriter, out: &mut BytesMut) {
        for piece in Piece::whole_call(call()) {
            writer.piece(out, piece);
        }
    }

    #[test]
    fn a_text_answer_streams_one_text_block() {
        let mut writer = BlockWriter::new("msg_1".into(), "m".into(), 10);
        let mut out = BytesMut::new();
        writer.start(&mut out);
        writer.piece(&mut out, Piece::Content("Hel".into()));
        writer.piece(&mut out, Piece::Content("".into()));
        writer.piece(&mut out, Piece::Content("lo".into()));
        writer.cached_tokens = 3;
        writer.end(&mut out, StopReason::StopSequence("END".into()), 4);
        let events = events(&out);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let start = &events[0].1["message"];
        assert_eq!(start["id"], "msg_1");
        assert_eq!(start["content"], json!([]));
        assert_eq!(start["usage"]["input_tokens"], 10);
        assert_eq!(
            events[2].1["content_block"],
            json!({"type": "text", "text": ""})
        );
        assert_eq!(
            events[3].1["delta"],
            json!({"type": "text_delta", "text": "Hel"})
        );
        assert_eq!(events[4].1["index"], 0);
        assert_eq!(
            events[6].1,
            json!({"type": "message_delta",
                   "delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"},
                   "usage": {"input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": 4}})
        );
    }

    #[test]
    fn thinking_text_and_tool_calls_are_blocks_in_order() {
        let mut writer = BlockWriter::new("msg_1".into(), "m".into(), 1);
        let mut out = BytesMut::new();
        writer.piece(&mut out, Piece::Reasoning("hmm".into()));
        writer.piece(&mut out, Piece::Content("Checking.".into()));
        whole_call(&mut writer, &mut out);
        writer.end(&mut out, StopReason::EndTurn, 9);
        let events = events(&out);
        let summary: Vec<(String, Value)> = events
            .iter()
            .map(|(name, data)| (name.clone(), data["index"].clone()))
            .collect();
        let at = |name: &str, index: u32| (name.to_owned(), json!(index));
        assert_eq!(
            summary,
            [
                at("content_block_start", 0),
                at("content_block_delta", 0),
                at("content_block_stop", 0),
                at("content_block_start", 1),
                at("content_block_delta", 1),
                at("content_block_stop", 1),
                at("content_block_start", 2),
                at("content_block_delta", 2),
                at("content_block_stop", 2),
                ("message_delta".to_owned(), Value::Null),
                ("message_stop".to_owned(), Value::Null)
            ]
        );
        assert_eq!(
            events[0].1["content_block"],
            json!({"type": "thinking", "thinking": "", "signature": ""})
        );
        assert_eq!(
            events[1].1["delta"],
            json!({"type": "thinking_delta", "thinking": "hmm"})
        );
        assert_eq!(
            events[6].1["content_block"],
            json!({"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}})
        );
        assert_eq!(
            events[7].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"city\":\"Paris\"}"})
        );
        assert_eq!(events[9].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(events[9].1["delta"]["stop_sequence"], Value::Null);
    }

    #[test]
    fn a_streamed_call_is_one_block_with_a_delta_per_fragment() {
        let mut shaper = OutputShaper::new(
            None,
            Some(iris_parsers::ToolCallParser::tagged(
                iris_parsers::ToolSyntax::Hermes,
            )),
        );
        let mut writer = BlockWriter::new("msg_1".into(), "m".into(), 1);
        let mut out = BytesMut::new();
        let text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2, 3]}}\n</tool_call>";
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(5) {
            for piece in shaper.push(&chunk.iter().collect::<String>()) {
                writer.piece(&mut out, piece);
            }
        }
        for piece in shaper.finish() {
            writer.piece(&mut out, piece);
        }
        writer.end(&mut out, StopReason::EndTurn, 9);
        let events = events(&out);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        let tool_start = events
            .iter()
            .position(|(_, d)| d["content_block"]["type"] == "tool_use")
            .expect("a tool_use block");
        assert_eq!(
            events[tool_start].1["content_block"],
            json!({"type": "tool_use", "id": events[tool_start].1["content_block"]["id"],
                   "name": "get_weather", "input": {}})
        );
        assert_eq!(events[tool_start].1["index"], 1);
        let stop = tool_start
            + names[tool_start..]
                .iter()
                .position(|n| *n == "content_block_stop")
                .expect("its stop");
        let fragments: Vec<&str> = events[tool_start + 1..stop]
            .iter()
            .map(|(name, data)| {
                assert_eq!(name, "content_block_delta");
                assert_eq!(data["index"], 1);
                assert_eq!(data["delta"]["type"], "input_json_delta");
                data["delta"]["partial_json"].as_str().expect("a fragment")
            })
            .collect();
        assert!(fragments.len() > 3, "{fragments:?}");
        let input: Value = serde_json::from_str(&fragments.concat()).expect("JSON");
        assert_eq!(input, json!({"city": "Paris", "days": [1, 2, 3]}));
        assert_eq!(&names[stop + 1..], ["message_delta", "message_stop"]);
        assert_eq!(events[stop + 1].1["delta"]["stop_reason"], "tool_use");
    }
}
