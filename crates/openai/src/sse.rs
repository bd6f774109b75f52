//! Server-sent events for streamed answers.
//!
//! A stream is, per choice: one role chunk
//! (`delta: {"role":"assistant","content":""}`), content chunks and a final
//! chunk with `finish_reason` and an empty delta; with `n` > 1 the chunks of
//! the choices interleave, each carrying its `index`. Then an optional usage
//! chunk (`choices: []`) and `data: [DONE]`. Each event is
//! `data: <json>\n\n`.
//!
//! [`ChunkWriter`] serialises the part shared by every chunk of a choice
//! (id, object, created, model, index) once; a content chunk then costs one
//! copy of that prefix plus the escaped delta text, appended to any
//! [`bytes::BufMut`] (`Vec<u8>`, `BytesMut`). [`ChunkWriter::for_choice`]
//! gives the writer of another choice.

use bytes::{BufMut, Bytes, BytesMut};

use crate::json;
use crate::{ApiError, ChoiceLogprobs, FinishReason, Usage};

/// The event that ends every stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// Start of an event.
const DATA: &[u8] = b"data: ";
/// End of an event.
const END: &[u8] = b"\n\n";
/// After the delta contents of a chunk that does not finish.
const CHOICE_CLOSE_OPEN: &[u8] = b"},\"logprobs\":null,\"finish_reason\":null}]}";

/// Writes the chunks of one choice of a stream. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ChunkWriter {
    /// `data: {"id":..,"object":"chat.completion.chunk","created":..,"model":..,"choices":[`
    head: Bytes,
    /// `{"index":N,"delta":{`: the opening of this writer's choice.
    choice_open: Bytes,
    /// `head` followed by `choice_open` and `"content":"`.
    content_head: Bytes,
}

impl ChunkWriter {
    /// Pre-serialises the fields shared by every chunk of the stream; the
    /// writer is choice 0's.
    pub fn new(id: &str, created: u64, model: &str) -> Self {
        let mut head = Vec::with_capacity(96 + id.len() + model.len());
        head.put_slice(DATA);
        head.put_slice(b"{\"id\":");
        json::write_str(&mut head, id);
        head.put_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        json::write_u64(&mut head, created);
        head.put_slice(b",\"model\":");
        json::write_str(&mut head, model);
        head.put_slice(b",\"choices\":[");
        Self::with_head(head.into(), 0)
    }

    /// The writer of choice `index` of the same stream.
    pub fn for_choice(&self, index: u32) -> Self {
        Self::with_head(self.head.clone(), index)
    }

    fn with_head(head: Bytes, index: u32) -> Self {
        let mut choice_open = Vec::with_capacity(32);
        choice_open.put_slice(b"{\"index\":");
        json::write_u64(&mut choice_open, u64::from(index));
        choice_open.put_slice(b",\"delta\":{");
        let mut content_head = Vec::with_capacity(head.len() + choice_open.len() + 12);
        content_head.put_slice(&head);
        content_head.put_slice(&choice_open);
        content_head.put_slice(b"\"content\":\"");
        Self {
            head,
            choice_open: choice_open.into(),
            content_head: content_head.into(),
        }
    }

    /// The first chunk: `delta: {"role":"assistant","content":""}`.
    pub fn write_role<B: BufMut>(&self, out: &mut B) {
        out.put_slice(&self.head);
        out.put_slice(&self.choice_open);
        out.put_slice(b"\"role\":\"assistant\",\"content\":\"\"");
        out.put_slice(CHOICE_CLOSE_OPEN);
        out.put_slice(END);
    }

    /// A content chunk: `delta: {"content": text}`.
    pub fn write_content<B: BufMut>(&self, out: &mut B, text: &str) {
        out.put_slice(&self.content_head);
        json::write_escaped(out, text);
        out.put_u8(b'"');
        out.put_slice(CHOICE_CLOSE_OPEN);
        out.put_slice(END);
    }

    /// A content chunk with the log probabilities of the tokens behind it.
    pub fn write_content_with_logprobs<B: BufMut>(
        &self,
        out: &mut B,
        text: &str,
        logprobs: &ChoiceLogprobs,
    ) {
        out.put_slice(&self.content_head);
        json::write_escaped(out, text);
        out.put_slice(b"\"},\"logprobs\":");
        // A struct of strings, byte lists and finite floats serialises.
        let _ = serde_json::to_writer(BufMut::writer(&mut *out), logprobs);
        out.put_slice(b",\"finish_reason\":null}]}");
        out.put_slice(END);
    }

    /// A reasoning chunk: `delta: {"reasoning_content": text}`.
    pub fn write_reasoning<B: BufMut>(&self, out: &mut B, text: &str) {
        self.write_delta(out, |out| {
            out.put_slice(b"\"reasoning_content\":");
            json::write_str(out, text);
        });
    }

    /// The first chunk of tool call `index`: its id, type and name, and
    /// empty arguments.
    pub fn write_tool_call_start<B: BufMut>(&self, out: &mut B, index: u32, id: &str, name: &str) {
        self.write_delta(out, |out| {
            out.put_slice(b"\"tool_calls\":[{\"index\":");
            json::write_u64(out, u64::from(index));
            out.put_slice(b",\"id\":");
            json::write_str(out, id);
            out.put_slice(b",\"type\":\"function\",\"function\":{\"name\":");
            json::write_str(out, name);
            out.put_slice(b",\"arguments\":\"\"}}]");
        });
    }

    /// A piece of the arguments of tool call `index`.
    pub fn write_tool_call_arguments<B: BufMut>(&self, out: &mut B, index: u32, arguments: &str) {
        self.write_delta(out, |out| {
            out.put_slice(b"\"tool_calls\":[{\"index\":");
            json::write_u64(out, u64::from(index));
            out.put_slice(b",\"function\":{\"arguments\":");
            json::write_str(out, arguments);
            out.put_slice(b"}}]");
        });
    }

    /// A chunk whose delta members `members` writes.
    fn write_delta<B: BufMut>(&self, out: &mut B, members: impl FnOnce(&mut B)) {
        out.put_slice(&self.head);
        out.put_slice(&self.choice_open);
        members(out);
        out.put_slice(CHOICE_CLOSE_OPEN);
        out.put_slice(END);
    }

    /// The last choice chunk: empty delta and `finish_reason`.
    pub fn write_finish<B: BufMut>(&self, out: &mut B, reason: FinishReason) {
        out.put_slice(&self.head);
        out.put_slice(&self.choice_open);
        out.put_slice(b"},\"logprobs\":null,\"finish_reason\":\"");
        out.put_slice(reason.as_str().as_bytes());
        out.put_slice(b"\"}]}");
        out.put_slice(END);
    }

    /// The usage chunk sent when `include_usage` is set: `choices: []`.
    pub fn write_usage<B: BufMut>(&self, out: &mut B, usage: &Usage) {
        out.put_slice(&self.head);
        out.put_slice(b"],\"usage\":{\"prompt_tokens\":");
        json::write_u64(out, u64::from(usage.prompt_tokens));
        out.put_slice(b",\"completion_tokens\":");
        json::write_u64(out, u64::from(usage.completion_tokens));
        out.put_slice(b",\"total_tokens\":");
        json::write_u64(out, u64::from(usage.total_tokens));
        if let Some(details) = usage.prompt_tokens_details {
            out.put_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
            json::write_u64(out, u64::from(details.cached_tokens));
            out.put_slice(b"}");
        }
        out.put_slice(b"}}");
        out.put_slice(END);
    }

    /// A content chunk as its own buffer, sized to fit.
    pub fn content_bytes(&self, text: &str) -> Bytes {
        let mut out = BytesMut::with_capacity(self.content_head.len() + text.len() + 64);
        self.write_content(&mut out, text);
        out.freeze()
    }

    /// Bytes one content chunk takes before its text: for sizing buffers.
    pub fn content_overhead(&self) -> usize {
        self.content_head.len() + 1 + CHOICE_CLOSE_OPEN.len() + END.len()
    }
}

/// Appends `data: [DONE]\n\n`.
pub fn write_done<B: BufMut>(out: &mut B) {
    out.put_slice(DONE);
}

/// Appends an in-stream error: `data: {"error":{...}}\n\n`.
pub fn write_error_event<B: BufMut>(out: &mut B, err: &ApiError) {
    out.put_slice(DATA);
    err.write_json(out);
    out.put_slice(END);
}

/// Appends `data: <json>\n\n` around an already serialised JSON value.
pub fn write_event<B: BufMut>(out: &mut B, json: &[u8]) {
    out.put_slice(DATA);
    out.put_slice(json);
    out.put_slice(END);
}
