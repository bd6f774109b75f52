//! A Response as server-sent events (`event: <type>` and `data: <json>`,
//! every event with the next `sequence_number`): `response.created` and
//! `response.in_progress`, then each output item's events as its text is
//! decoded and shaped ([`Output`]), then `response.completed` (or
//! `response.incomplete` when `max_output_tokens` cut the answer) with the
//! whole Response, stored first when asked. A failure after the start is
//! `response.failed` (the Response with its `error`) and an `error` event.
//! The stream ends with `data: [DONE]`, which OpenAI's clients skip.

use std::sync::Arc;

use axum::response::Response;
use bytes::BytesMut;
use iris_openai::{ApiError, FinishReason};
use iris_parsers::OutputShaper;
use iris_proto::scheduler::generate_response::Response as Reply;
use serde_json::{json, Value};
use tokenizers::Tokenizer;

use super::object::{response, Counts, Output, Status};
use super::request::Context;
use super::unary::reasoning_tokens;
use super::{save, ReadyResponse};
use crate::chat::choice::{ChoiceText, Visible};
use crate::http::errors::stream_ended;
use crate::http::replies;
use crate::http::sse::{self, Events};
use crate::http::{Failure, Ledger};
use crate::metrics::Outcome;
use crate::router::Generation;
use crate::server::AppState;

pub async fn respond(state: Arc<AppState>, ledger: Ledger, ready: ReadyResponse) -> Response {
    let id = ledger.id.clone();
    let prompt_tokens = ledger.prompt_tokens;
    let store = state.clone();
    let start = async move {
        let ReadyResponse {
            mut conversation,
            context,
        } = ready;
        let generation = conversation.start().await?;
        let tokenizer = conversation.served.prompter.tokenizer().clone();
        Ok(ResponseEvents {
            state: store,
            id,
            model: conversation.served.name.clone(),
            context,
            generation,
            text: ChoiceText::new(
                conversation.served.prompter.detok().clone(),
                conversation.stop.clone(),
                false,
            )
            .keeping(conversation.output.kept_tokens()),
            shaper: conversation.output.shaper(),
            tokenizer,
            output: Output::new(true),
            prompt_tokens,
            cached_tokens: 0,
            completed: false,
            unsaved: None,
        })
    };
    sse::respond(state, ledger, start).await
}

/// The Responses endpoint's side of one SSE answer.
struct ResponseEvents {
    state: Arc<AppState>,
    id: String,
    model: String,
    context: Context,
    generation: Generation,
    text: ChoiceText,
    shaper: OutputShaper,
    tokenizer: Arc<Tokenizer>,
    output: Output,
    prompt_tokens: u32,
    cached_tokens: u32,
    /// The worker sent its GenerateComplete.
    completed: bool,
    /// The final Response, to store before its event is sent.
    unsaved: Option<Value>,
}

impl ResponseEvents {
    fn lifecycle(&mut self, out: &mut BytesMut, kind: &str, status: &Status, usage: bool) {
        let usage = usage.then(|| self.counts().usage());
        let object = response(
            &self.id,
            &self.model,
            &self.context,
            status,
            &self.output.items,
            usage,
        );
        if matches!(status, Status::Completed | Status::Incomplete) {
            self.unsaved = Some(object.clone());
        }
        self.output.event(out, kind, json!({"response": object}));
    }

    fn counts(&self) -> Counts {
        Counts {
            input: self.prompt_tokens,
            cached: self.cached_tokens,
            output: self.text.completion_tokens,
            reasoning: reasoning_tokens(&self.tokenizer, &self.output.reasoning),
        }
    }

    /// Writes what became visible; `true` once the answer has ended.
    fn emit(
        &mut self,
        out: &mut BytesMut,
        visible: Result<Visible, ApiError>,
    ) -> Result<bool, Failure> {
        let visible = visible.map_err(|error| (error, Outcome::UpstreamError))?;
        if !visible.text.is_empty() {
            let pieces = if self.shaper.is_passthrough() {
                vec![iris_parsers::Piece::Content(visible.text)]
            } else {
                self.shaper.push(&visible.text)
            };
            for piece in pieces {
                self.output.piece(out, piece);
            }
        }
        Ok(self.text.finish.is_some())
    }
}

impl Events for ResponseEvents {
    type Event = Option<Reply>;

    fn open(&mut self, out: &mut BytesMut) {
        self.lifecycle(out, "response.created", &Status::InProgress, false);
        self.lifecycle(out, "response.in_progress", &Status::InProgress, false);
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
                self.cached_tokens = self.cached_tokens.max(chunk.cached_tokens);
                let visible = self.text.push_chunk(&chunk.token_ids, None);
                self.emit(out, visible)
            }
            Some(Reply::Complete(complete)) => {
                if complete.finish_reason == "abort" {
                    let error = ApiError::bad_gateway("the worker aborted the request");
                    return Err((error, Outcome::UpstreamError));
                }
                self.completed = true;
                self.cached_tokens = self.cached_tokens.max(complete.cached_tokens);
                let visible = self.text.complete(&complete);
                self.emit(out, visible)
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
            self.generation.abort("stop string matched");
        }
        let cut = matches!(self.text.finish, Some(FinishReason::Length));
        let last = self.shaper.finish();
        self.output.last_pieces(out, last, cut);
        self.output.finish(out, cut);
        if cut {
            self.lifecycle(out, "response.incomplete", &Status::Incomplete, true);
        } else {
            self.lifecycle(out, "response.completed", &Status::Completed, true);
        }
    }

    fn write_error(&mut self, out: &mut BytesMut, error: &ApiError) {
        self.lifecycle(
            out,
            "response.failed",
            &Status::Failed(error.clone()),
            false,
        );
        self.output.event(
            out,
            "error",
            json!({"code": error.code, "message": error.message, "param": error.param}),
        );
    }

    async fn settle(&mut self) {
        if let Some(object) = self.unsaved.take() {
            save(&self.state, &self.id, &self.context, &object).await;
        }
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
}
