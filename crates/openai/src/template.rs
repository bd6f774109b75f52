//! Chat messages as Hugging Face chat templates expect them, shared by the
//! gateway's prompt building and the fuzz targets that exercise it.

use serde_json::{json, Value};

use crate::{ChatMessage, ContentPart, MessageContent};

/// Messages as Hugging Face chat templates expect them: `developer`
/// becomes `system`, image parts become `{"type": "image"}`.
pub fn template_messages(messages: &[ChatMessage]) -> Value {
    let part = |p: &ContentPart| match p {
        ContentPart::Text { text } => json!({"type": "text", "text": text}),
        ContentPart::ImageUrl { .. } => json!({"type": "image"}),
    };
    let content = |c: &Option<MessageContent>| match c {
        None => Value::String(String::new()),
        Some(MessageContent::Text(text)) => Value::String(text.clone()),
        Some(MessageContent::Parts(parts)) => Value::Array(parts.iter().map(part).collect()),
    };
    Value::Array(
        messages
            .iter()
            .map(|m| json!({"role": m.role.template_role(), "content": content(&m.content)}))
            .collect(),
    )
}
