//! Streaming chat answers: the worker's token chunks become OpenAI SSE
//! chunks ([`crate::http::sse`] runs the stream). Each choice (`n` of
//! them, told apart by the chunks' sequence `index`) has its own
//! [`ChoiceText`] (incremental, UTF-8 safe decoding; stop strings, which
//! may span chunks; logprobs) and its own role, content and finish chunks,
//! interleaved as the worker's chunks arrive. When every choice has ended
//! the stream ends with the usage chunk (when asked, summed over the
//! choices) and `[DONE]`; choices still generating after their stop string
//! are aborted then. Dropping the [`Generation`] (the client left) aborts
//! the workers.

use std::sync::Arc;

use axum::response::Response;
use bytes::BytesMut;
use iris_openai::sse::ChunkWriter;
use iris_openai::{unix_now, ApiError, ChoiceLogprobs, FinishReason, Usage};
use iris_parsers::{OutputShaper, Piece};
use iris_proto::scheduler::{
    generate_response::Response as Reply, GenerateComplete, GenerateStreamChunk,
};

use super::choice::{ChoiceText, Visible};
use super::complete::bad_index;
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
    let writer = ChunkWriter::new(&ledger.id, unix_now(), &prepared.served.name);
    let prompt_tokens = ledger.prompt_tokens;
    let start = async move {
        let generation = prepared.start().await?;
        Ok(ChatEvents::new(
            &prepared,
            writer,
            generation,
            prompt_tokens,
        ))
    };
    sse::respond(state, ledger, start).await
}

/// One choice of the stream: its chunk writer and its text.
struct StreamChoice {
    writer: ChunkWriter,
    text: ChoiceText,
    /// Splits reasoning and tool calls out of the text.
    shaper: OutputShaper,
    /// Its tool calls' deltas.
    calls: CallDeltas,
    /// The worker sent this sequence's GenerateComplete.
    completed: bool,
    /// Its finish chunk was written.
    reported: bool,
}

impl StreamChoice {
    /// Writes what became visible: as content (with its tokens' log
    /// probabilities), or through the shaper when reasoning or tool calls
    /// are parsed out.
    fn write_visible(&mut self, out: &mut BytesMut, visible: Visible) {
        let logprobs = visible
            .logprobs
            .filter(|lp| !lp.is_empty())
            .map(ChoiceLogprobs::new);
        if self.shaper.is_passthrough() {
            return self.write_content(out, &visible.text, logprobs.as_ref());
        }
        let pieces = if visible.text.is_empty() {
            Vec::new()
        } else {
            self.shaper.push(&visible.text)
        };
        let mut logprobs = logprobs;
        for piece in pieces {
            if let Piece::Content(text) = &piece {
                self.write_content(out, text, logprobs.take().as_ref());
            } else {
                self.write_piece(out, piece);
            }
        }
        // Tokens that went to reasoning or a tool call keep their log
        // probabilities, on an empty content delta.
        if let Some(lp) = logprobs {
            self.writer.write_content_with_logprobs(out, "", &lp);
        }
    }

    fn write_content(&self, out: &mut BytesMut, text: &str, logprobs: Option<&ChoiceLogprobs>) {
        match logprobs {
            Some(lp) => self.writer.write_content_with_logprobs(out, text, lp),
            None if !text.is_empty() => self.writer.write_content(out, text),
            None => {}
        }
    }

    /// One shaped piece: content, reasoning, or a part of a tool call.
    fn write_piece(&mut self, out: &mut BytesMut, piece: Piece) {
        match piece {
            Piece::Content(text) => self.writer.write_content(out, &text),
            Piece::Reasoning(text) => self.writer.write_reasoning(out, &text),
            call => self.calls.write(&self.writer, out, call),
        }
    }

    /// The shaper's held text, then the finish chunk (`tool_calls` once a
    /// call was written, unless the answer was cut).
    fn write_end(&mut self, out: &mut BytesMut, reason: FinishReason) {
        for piece in self.shaper.finish() {
            self.write_piece(out, piece);
        }
        let reason = reason.with_calls(self.calls.started > 0);
        self.writer.write_finish(out, reason);
        self.reported = true;
    }
}

/// Writes a choice's tool calls as OpenAI streams them: a chunk with the
/// call's index, id, type, name and empty arguments when it starts, then
/// one with its index and the fragment per fragment of its arguments.
#[derive(Debug, Default)]
struct CallDeltas {
    /// Calls started (the open or last one is the one before).
    started: u32,
}

impl CallDeltas {
    /// One part of a call (other pieces are not written here).
    fn write(&mut self, writer: &ChunkWriter, out: &mut BytesMut, piece: Piece) {
        match piece {
            Piece::CallStart { index, id, name } => {
                self.started = index + 1;
                writer.write_tool_call_start(out, index, &id, &name);
            }
            Piece::CallArgs(fragment) if !fragment.is_empty() => {
                let index = self.started.saturating_sub(1);
                writer.write_tool_call_arguments(out, index, &fragment);
            }
            _ => {}
        }
    }
}

/// The chat endpoint's side of one SSE answer.
struct ChatEvents {
    generation: Generation,
    choices: Vec<StreamChoice>,
    include_usage: bool,
    prompt_tokens: u32,
    /// Prompt tokens the worker reported serving from its prefix cache.
    cached_tokens: u32,
}

impl ChatEvents {
    fn new(
        prepared: &ReadyConversation,
        writer: ChunkWriter,
        generation: Generation,
        prompt_tokens: u32,
    ) -> ChatEvents {
        let choices = super::choices(prepared)
            .into_iter()
            .enumerate()
            .map(|(index, text)| StreamChoice {
                writer: writer.for_choice(index as u32),
                text,
                shaper: prepared.output.shaper(),
                calls: CallDeltas::default(),
                completed: false,
                reported: false,
            })
            .collect();
        ChatEvents {
            generation,
            choices,
            include_usage: prepared.request.include_usage(),
            prompt_tokens,
            cached_tokens: 0,
        }
    }

    /// The choice a worker message is for; a failure for an index the
    /// request did not ask for.
    fn choice_at(&self, index: u32) -> Result<usize, Failure> {
        if (index as usize) < self.choices.len() {
            return Ok(index as usize);
        }
        Err(bad_index(
            &self.generation,
            index as usize,
            self.choices.len(),
        ))
    }

    fn chunk(&mut self, out: &mut BytesMut, chunk: &GenerateStreamChunk) -> Result<bool, Failure> {
        let i = self.choice_at(chunk.index)?;
        self.cached_tokens = self.cached_tokens.max(chunk.cached_tokens);
        let choice = &mut self.choices[i];
        let pushed = choice
            .text
            .push_chunk(&chunk.token_ids, chunk.output_logprobs.as_ref());
        self.emit(out, i, pushed)
    }

    fn complete(
        &mut self,
        out: &mut BytesMut,
        complete: &GenerateComplete,
    ) -> Result<bool, Failure> {
        if complete.finish_reason == "abort" {
            let error = ApiError::bad_gateway("the worker aborted the request");
            return Err((error, Outcome::UpstreamError));
        }
        let i = self.choice_at(complete.index)?;
        self.cached_tokens = self.cached_tokens.max(complete.cached_tokens);
        let choice = &mut self.choices[i];
        choice.completed = true;
        let visible = choice.text.complete(complete);
        self.emit(out, i, visible)
    }

    /// Writes what choice `i` made visible, and its finish chunk when it
    /// has ended; `true` once every choice has.
    fn emit(
        &mut self,
        out: &mut BytesMut,
        i: usize,
        visible: Result<Visible, ApiError>,
    ) -> Result<bool, Failure> {
        let visible = visible.map_err(|error| (error, Outcome::UpstreamError))?;
        let choice = &mut self.choices[i];
        choice.write_visible(out, visible);
        let Some(reason) = choice.text.finish else {
            return Ok(false);
        };
        if choice.reported {
            return Ok(false);
        }
        choice.write_end(out, reason);
        Ok(self.choices.iter().all(|c| c.reported))
    }
}

impl Events for ChatEvents {
    type Event = Option<Reply>;

    fn open(&mut self, out: &mut BytesMut) {
        for choice in &self.choices {
            choice.writer.write_role(out);
        }
    }

    async fn next(&mut self) -> Option<Result<Self::Event, Failure>> {
        replies::next_reply(&mut self.generation).await
    }

    fn carries_tokens(event: &Self::Event) -> bool {
        replies::carries_tokens(event)
    }

    fn event(&mut self, out: &mut BytesMut, event: Self::Event) -> Result<bool, Failure> {
        match event {
            Some(Reply::Chunk(chunk)) => self.chunk(out, &chunk),
            Some(Reply::Complete(complete)) => self.complete(out, &complete),
            None => Ok(false),
        }
    }

    fn exhausted(&mut self) -> Result<(), Failure> {
        let worker = self.generation.worker.url.to_string();
        Err((stream_ended(&worker), Outcome::UpstreamError))
    }

    fn finish(&mut self, out: &mut BytesMut) {
        if self.choices.iter().all(|c| c.completed) {
            self.generation.finish();
        } else {
            self.generation.abort("stop string matched");
        }
        if self.include_usage {
            let usage = Usage::new(self.prompt_tokens, self.completion_tokens())
                .with_cached_tokens(self.cached_tokens);
            self.choices[0].writer.write_usage(out, &usage);
        }
    }

    fn abort(&mut self, reason: &str) {
        self.generation.abort(reason);
    }

    fn completion_tokens(&self) -> u32 {
        self.choices.iter().map(|c| c.text.completion_tokens).sum()
    }

    fn migrations(&self) -> u32 {
        self.generation.migrations()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_parsers::{ToolCallParser, ToolSyntax};
    use serde_json::{json, Value};

    /// The `tool_calls` deltas of the chunks written.
    fn call_deltas(out: &BytesMut) -> Vec<Value> {
        std::str::from_utf8(out)
            .expect("utf-8")
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(|d| serde_json::from_str::<Value>(d).expect("json"))
            .map(|c| c["choices"][0]["delta"]["tool_calls"][0].clone())
            .collect()
    }

    #[test]
    fn a_call_streams_its_start_then_argument_fragments() {
        let writer = ChunkWriter::new("chatcmpl-1", 1, "m");
        let mut shaper = OutputShaper::new(None, Some(ToolCallParser::tagged(ToolSyntax::Hermes)));
        let mut calls = CallDeltas::default();
        let mut out = BytesMut::new();
        let text = "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"path\": \"a.txt\", \"text\": \"line one\\nline two\"}}\n</tool_call><tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
        let chars: Vec<char> = text.chars().collect();
        let mut pieces = Vec::new();
        for chunk in chars.chunks(4) {
            pieces.extend(shaper.push(&chunk.iter().collect::<String>()));
        }
        pieces.extend(shaper.finish());
        for piece in pieces {
            calls.write(&writer, &mut out, piece);
        }
        let deltas = call_deltas(&out);
        assert_eq!(
            deltas[0],
            json!({"index": 0, "id": deltas[0]["id"], "type": "function",
                   "function": {"name": "write", "arguments": ""}})
        );
        let first: Vec<&Value> = deltas.iter().filter(|d| d["index"] == 0).collect();
        assert!(first.len() > 3, "several fragments: {first:?}");
        for delta in &first[1..] {
            assert!(delta.get("id").is_none() && delta["function"].get("name").is_none());
        }
        let arguments: String = first
            .iter()
            .filter_map(|d| d["function"]["arguments"].as_str())
            .collect();
        let arguments: Value = serde_json::from_str(&arguments).expect("JSON arguments");
        assert_eq!(
            arguments,
            json!({"path": "a.txt", "text": "line one\nline two"})
        );
        let second: Vec<&Value> = deltas.iter().filter(|d| d["index"] == 1).collect();
        assert_eq!(second[0]["function"]["name"], "now");
        let arguments: String = second[1..]
            .iter()
            .filter_map(|d| d["function"]["arguments"].as_str())
            .collect();
        assert_eq!(arguments, "{}");
        assert_eq!(calls.started, 2);
    }
}
