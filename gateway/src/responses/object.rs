//! The Response object and its output items, built from the shaped pieces
//! of the answer (reasoning, text, tool calls) in the order they come.
//! [`Output`] does it for both answer shapes: the stream writes each
//! step's events as it goes (`response.output_item.added`, the deltas,
//! `….done`), the unary answer only keeps the items.

use bytes::{BufMut, BytesMut};
use iris_openai::ApiError;
use iris_parsers::Piece;
use serde_json::{json, Map, Value};

use super::new_item_id;
use super::request::Context;

/// Token counts of an answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub input: u32,
    pub cached: u32,
    pub output: u32,
    pub reasoning: u32,
}

impl Counts {
    pub fn usage(&self) -> Value {
        json!({
            "input_tokens": self.input,
            "input_tokens_details": {"cached_tokens": self.cached, "cache_write_tokens": 0},
            "output_tokens": self.output,
            "output_tokens_details": {"reasoning_tokens": self.reasoning},
            "total_tokens": self.input + self.output,
        })
    }
}

/// How a response ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    InProgress,
    Completed,
    /// Cut by `max_output_tokens`.
    Incomplete,
    Failed(ApiError),
}

impl Status {
    fn as_str(&self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete => "incomplete",
            Status::Failed(_) => "failed",
        }
    }
}

/// The Response object.
pub fn response(
    id: &str,
    model: &str,
    context: &Context,
    status: &Status,
    output: &[Value],
    usage: Option<Value>,
) -> Value {
    let mut object = Map::new();
    object.insert("id".into(), json!(id));
    object.insert("object".into(), json!("response"));
    object.insert("created_at".into(), json!(context.created_at));
    object.insert("status".into(), json!(status.as_str()));
    object.insert("background".into(), json!(false));
    object.insert(
        "error".into(),
        match status {
            Status::Failed(e) => json!({
                "code": e.code.clone().unwrap_or_else(|| "server_error".to_owned()),
                "message": e.message,
            }),
            _ => Value::Null,
        },
    );
    object.insert(
        "incomplete_details".into(),
        match status {
            Status::Incomplete => json!({"reason": "max_output_tokens"}),
            _ => Value::Null,
        },
    );
    object.insert("model".into(), json!(model));
    object.insert("output".into(), Value::Array(output.to_vec()));
    for (key, value) in &context.echo {
        object.insert(key.clone(), value.clone());
    }
    object.insert("usage".into(), usage.unwrap_or(Value::Null));
    Value::Object(object)
}

/// The item being written.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    /// A function call: its arguments so far.
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// A function-call item.
fn call_item(id: &str, call_id: &str, name: &str, status: &str, arguments: &str) -> Value {
    json!({
        "id": id, "type": "function_call", "status": status,
        "call_id": call_id, "name": name, "arguments": arguments,
    })
}

/// The output items of one answer, and (when streaming) their events.
pub struct Output {
    /// Whether events are written.
    events: bool,
    /// The next event's `sequence_number`.
    pub sequence: u64,
    /// Finished items.
    pub items: Vec<Value>,
    open: Option<Open>,
    /// The reasoning text, all of it (for its token count).
    pub reasoning: String,
}

impl Output {
    pub fn new(events: bool) -> Output {
        Output {
            events,
            sequence: 0,
            items: Vec::new(),
            open: None,
            reasoning: String::new(),
        }
    }

    /// Writes event `kind` with `fields` (its `type` and `sequence_number`
    /// added).
    pub fn event(&mut self, out: &mut BytesMut, kind: &str, fields: Value) {
        if !self.events {
            return;
        }
        let mut object = Map::new();
        object.insert("type".into(), json!(kind));
        object.insert("sequence_number".into(), json!(self.sequence));
        if let Value::Object(fields) = fields {
            object.extend(fields);
        }
        self.sequence += 1;
        out.put_slice(b"event: ");
        out.put_slice(kind.as_bytes());
        out.put_slice(b"\ndata: ");
        // A map of JSON values serialises.
        let _ = serde_json::to_writer(out.writer(), &Value::Object(object));
        out.put_slice(b"\n\n");
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    /// One shaped piece of the answer.
    pub fn piece(&mut self, out: &mut BytesMut, piece: Piece) {
        match piece {
            Piece::Reasoning(text) => self.reasoning_text(out, &text),
            Piece::Content(text) => self.text(out, &text),
            Piece::CallStart { id, name, .. } => {
                self.close(out, false);
                let item_id = new_item_id("fc");
                let index = self.index();
                let added = call_item(&item_id, &id, &name, "in_progress", "");
                self.event(
                    out,
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                );
                self.open = Some(Open::Call {
                    id: item_id,
                    call_id: id,
                    name,
                    arguments: String::new(),
                });
            }
            Piece::CallArgs(fragment) => self.call_arguments(out, &fragment),
            Piece::CallEnd => {
                if matches!(self.open, Some(Open::Call { .. })) {
                    self.close(out, false);
                }
            }
        }
    }

    /// A fragment of the open call's arguments.
    fn call_arguments(&mut self, out: &mut BytesMut, delta: &str) {
        let index = self.index();
        let Some(Open::Call { id, arguments, .. }) = &mut self.open else {
            return;
        };
        if delta.is_empty() {
            return;
        }
        arguments.push_str(delta);
        let id = id.clone();
        self.event(
            out,
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": delta}),
        );
    }

    fn reasoning_text(&mut self, out: &mut BytesMut, delta: &str) {
        if delta.is_empty() {
            return;
        }
        self.reasoning.push_str(delta);
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close(out, false);
            let id = new_item_id("rs");
            let index = self.index();
            self.event(
                out,
                "response.output_item.added",
                json!({"output_index": index, "item": {"id": id, "type": "reasoning", "summary": []}}),
            );
            self.event(
                out,
                "response.reasoning_summary_part.added",
                json!({"item_id": id, "output_index": index, "summary_index": 0,
                       "part": {"type": "summary_text", "text": ""}}),
            );
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        }
        let index = self.index();
        let Some(Open::Reasoning { id, text }) = &mut self.open else {
            return;
        };
        text.push_str(delta);
        let id = id.clone();
        self.event(
            out,
            "response.reasoning_summary_text.delta",
            json!({"item_id": id, "output_index": index, "summary_index": 0, "delta": delta}),
        );
    }

    fn text(&mut self, out: &mut BytesMut, delta: &str) {
        if delta.is_empty() {
            return;
        }
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close(out, false);
            let id = new_item_id("msg");
            let index = self.index();
            self.event(
                out,
                "response.output_item.added",
                json!({"output_index": index, "item": {
                    "id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": [],
                }}),
            );
            self.event(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
            );
            self.open = Some(Open::Message {
                id,
                text: String::new(),
            });
        }
        let index = self.index();
        let Some(Open::Message { id, text }) = &mut self.open else {
            return;
        };
        text.push_str(delta);
        let id = id.clone();
        self.event(
            out,
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}),
        );
    }

    /// Ends the open item; a message or call cut by the token limit is
    /// `incomplete`.
    pub fn close(&mut self, out: &mut BytesMut, cut: bool) {
        let index = self.index();
        match self.open.take() {
            None => {}
            Some(Open::Reasoning { id, text }) => {
                self.event(
                    out,
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": index, "summary_index": 0, "text": text}),
                );
                let part = json!({"type": "summary_text", "text": text});
                self.event(
                    out,
                    "response.reasoning_summary_part.done",
                    json!({"item_id": id, "output_index": index, "summary_index": 0, "part": part}),
                );
                let item = json!({"id": id, "type": "reasoning", "summary": [part]});
                self.event(
                    out,
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                self.items.push(item);
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                arguments,
            }) => {
                self.event(
                    out,
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
                );
                let status = if cut { "incomplete" } else { "completed" };
                let done = call_item(&id, &call_id, &name, status, &arguments);
                self.event(
                    out,
                    "response.output_item.done",
                    json!({"output_index": index, "item": done}),
                );
                self.items.push(done);
            }
            Some(Open::Message { id, text }) => {
                self.event(
                    out,
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                );
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                self.event(
                    out,
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
                let status = if cut { "incomplete" } else { "completed" };
                let item = json!({
                    "id": id, "type": "message", "status": status, "role": "assistant", "content": [part],
                });
                self.event(
                    out,
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                self.items.push(item);
            }
        }
    }

    /// The shaper's last pieces, when the answer ends: a call they end is
    /// `incomplete` when the token limit cut the answer (its arguments may
    /// be unfinished).
    pub fn last_pieces(&mut self, out: &mut BytesMut, pieces: Vec<Piece>, cut: bool) {
        for piece in pieces {
            match piece {
                Piece::CallEnd if matches!(self.open, Some(Open::Call { .. })) => {
                    self.close(out, cut)
                }
                piece => self.piece(out, piece),
            }
        }
    }

    /// Whether any item has been started.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.open.is_none()
    }

    /// Ends the output: the open item closed, and an empty message when
    /// the answer had no item at all (OpenAI's shape for an empty answer).
    pub fn finish(&mut self, out: &mut BytesMut, cut: bool) {
        if self.is_empty() {
            // An empty text still gets its message item.
            let id = new_item_id("msg");
            self.open = Some(Open::Message {
                id: id.clone(),
                text: String::new(),
            });
            let index = self.index();
            self.event(
                out,
                "response.output_item.added",
                json!({"output_index": index, "item": {
                    "id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": [],
                }}),
            );
            self.event(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
            );
        }
        self.close(out, cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(out: &BytesMut) -> Vec<Value> {
        String::from_utf8_lossy(out)
            .split("\n\n")
            .filter_map(|e| e.split_once("\ndata: "))
            .map(|(_, data)| serde_json::from_str(data).unwrap())
            .collect()
    }

    #[test]
    fn pieces_become_items_and_numbered_events() {
        let mut out = BytesMut::new();
        let mut output = Output::new(true);
        output.piece(&mut out, Piece::Reasoning("hm".into()));
        output.piece(&mut out, Piece::Reasoning("m".into()));
        output.piece(&mut out, Piece::Content("Hi".into()));
        output.piece(&mut out, Piece::Content(" there".into()));
        for piece in Piece::whole_call(iris_parsers::ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        }) {
            output.piece(&mut out, piece);
        }
        output.finish(&mut out, false);
        let kinds: Vec<String> = output.items.iter().map(|i| i["type"].to_string()).collect();
        assert_eq!(kinds, ["\"reasoning\"", "\"message\"", "\"function_call\""]);
        assert_eq!(output.items[0]["summary"][0]["text"], "hmm");
        assert_eq!(output.items[1]["content"][0]["text"], "Hi there");
        assert_eq!(output.items[2]["call_id"], "call_1");
        let events = events(&out);
        for (n, event) in events.iter().enumerate() {
            assert_eq!(event["sequence_number"], n as u64);
        }
        let deltas: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(deltas, "Hi there");
    }

    #[test]
    fn a_call_the_token_limit_cut_is_incomplete() {
        let start = Piece::CallStart {
            index: 0,
            id: "call_1".into(),
            name: "f".into(),
        };
        for (cut, status) in [(true, "incomplete"), (false, "completed")] {
            let mut out = BytesMut::new();
            let mut output = Output::new(true);
            output.piece(&mut out, start.clone());
            output.piece(&mut out, Piece::CallArgs("{\"a\": ".into()));
            output.last_pieces(&mut out, vec![Piece::CallEnd], cut);
            output.finish(&mut out, cut);
            assert_eq!(output.items.len(), 1);
            assert_eq!(output.items[0]["status"], status);
            assert_eq!(output.items[0]["arguments"], "{\"a\": ");
            let done = events(&out)
                .into_iter()
                .find(|e| e["type"] == "response.output_item.done")
                .expect("the item's done event");
            assert_eq!(done["item"]["status"], status);
        }
    }

    #[test]
    fn an_empty_answer_is_an_empty_message() {
        let mut out = BytesMut::new();
        let mut output = Output::new(false);
        output.finish(&mut out, true);
        assert!(out.is_empty());
        assert_eq!(output.items.len(), 1);
        assert_eq!(output.items[0]["status"], "incomplete");
        assert_eq!(output.items[0]["content"][0]["text"], "");
    }

    #[test]
    fn a_streamed_call_is_one_item_with_a_delta_per_fragment() {
        let mut out = BytesMut::new();
        let mut output = Output::new(true);
        let fragments = [r#"{"pa"#, r#"th": "a.rs", "#, r#""code": "fn main() {}"}"#];
        output.piece(&mut out, Piece::Content("Writing.".into()));
        output.piece(
            &mut out,
            Piece::CallStart {
                index: 0,
                id: "call_1".into(),
                name: "write".into(),
            },
        );
        for fragment in fragments {
            output.piece(&mut out, Piece::CallArgs(fragment.into()));
        }
        output.piece(&mut out, Piece::CallEnd);
        output.finish(&mut out, false);
        let events = events(&out);
        let kinds: Vec<&str> = events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or_default())
            .collect();
        let added = kinds
            .iter()
            .rposition(|k| *k == "response.output_item.added")
            .expect("the call's item");
        assert_eq!(
            &kinds[added..],
            [
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let item = &events[added]["item"];
        assert_eq!(
            (
                &item["type"],
                &item["status"],
                &item["call_id"],
                &item["name"],
                &item["arguments"]
            ),
            (
                &json!("function_call"),
                &json!("in_progress"),
                &json!("call_1"),
                &json!("write"),
                &json!("")
            )
        );
        let deltas: Vec<&Value> = events[added + 1..added + 4]
            .iter()
            .map(|e| &e["delta"])
            .collect();
        assert_eq!(
            deltas,
            fragments
                .iter()
                .map(|f| json!(f))
                .collect::<Vec<_>>()
                .iter()
                .collect::<Vec<_>>()
        );
        for event in &events[added + 1..] {
            assert_eq!(event["output_index"], 1);
            assert_eq!(
                event.get("item_id").unwrap_or(&event["item"]["id"]),
                &item["id"]
            );
        }
        let whole = fragments.concat();
        assert_eq!(events[added + 4]["arguments"], whole.as_str());
        assert_eq!(events[added + 5]["item"]["arguments"], whole.as_str());
        assert_eq!(output.items[1]["status"], "completed");
        assert_eq!(output.items[1]["arguments"], whole.as_str());
    }
}
