//! Tools: the `tools`, `tool_choice` and `parallel_tool_calls` request
//! fields, assistant messages' `tool_calls`, and what they mean for
//! decoding and for the answer.
//!
//! - [`Tool`] and [`MessageToolCall`] are the wire shapes;
//!   [`check_tools`] validates them (tool names, parameters being JSON
//!   objects, a named `tool_choice` naming a declared tool, arguments of
//!   earlier calls being JSON objects).
//! - [`ChatCompletionRequest::tool_choice_mode`] reads `tool_choice`;
//!   [`ChatCompletionRequest::tool_constraint`] builds the JSON schema that
//!   `required` or a named function constrains decoding to, and
//!   [`ChatCompletionRequest::tool_output`] says what form the tool calls
//!   then take in the generated text.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::request::Role;
use crate::{ApiError, ChatCompletionRequest, ChatMessage, Constraint};

/// Longest tool name (OpenAI's limit).
pub const MAX_TOOL_NAME: usize = 64;

/// One entry of `tools`. A key it (or its function) does not declare is a
/// 400 naming it (`tools[i].function.key`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Only `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    /// `[A-Za-z0-9_-]{1,64}`.
    pub name: String,
    /// What it does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON schema object for the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// OpenAI's strict mode; accepted, and the schema is always followed
    /// when decoding is constrained to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// A call in an assistant message's `tool_calls`. A key it does not
/// declare is a 400 naming it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageToolCall {
    /// The call's id, which the `tool` message answering it repeats.
    #[serde(default)]
    pub id: String,
    /// Only `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function and its arguments.
    pub function: CalledFunction,
    /// The call's position among a streamed answer's calls, which some
    /// clients copy back into the history; accepted, not used (the
    /// order of `tool_calls` is the order).
    #[serde(default, skip_serializing)]
    pub index: Option<u32>,
}

fn function_kind() -> String {
    "function".to_owned()
}

/// The function of a [`MessageToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalledFunction {
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON object, serialised.
    pub arguments: String,
}

/// `tool_choice`, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool (tools are not shown to the model).
    None,
    /// The model decides (the default when there are tools).
    Auto,
    /// At least one call; decoding is constrained to the tools' schemas.
    Required,
    /// A call of this function; decoding is constrained to its schema.
    Function(String),
}

/// The form tool calls take in the generated text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutput {
    /// No tool calls are parsed.
    None,
    /// The model's own syntax (`<tool_call>` blocks).
    Tagged,
    /// Plain JSON: an array of `{name, parameters}` (`named: None`) or the
    /// arguments of the named function.
    Json { named: Option<String> },
}

impl ChatCompletionRequest {
    /// The declared tools (empty when none).
    pub fn tool_list(&self) -> &[Tool] {
        self.tools.as_deref().unwrap_or_default()
    }

    /// `tool_choice` for a request that passed validation: absent means
    /// `auto` with tools and `none` without.
    pub fn tool_choice_mode(&self) -> ToolChoice {
        match self.tool_choice.as_ref().map(read_choice) {
            Some(Ok(Some(choice))) => choice,
            _ if self.tool_list().is_empty() => ToolChoice::None,
            _ => ToolChoice::Auto,
        }
    }

    /// The tools the model is shown: none when `tool_choice` is `none`.
    pub fn active_tools(&self) -> &[Tool] {
        match self.tool_choice_mode() {
            ToolChoice::None => &[],
            _ => self.tool_list(),
        }
    }

    /// The tools as chat templates take them (`None`: no tools shown).
    pub fn template_tools(&self) -> Option<Value> {
        let tools = self.active_tools();
        (!tools.is_empty()).then(|| serde_json::to_value(tools).unwrap_or_default())
    }

    /// The constraint `tool_choice` puts on decoding: for `required` an
    /// array of calls (at most one when `parallel_tool_calls` is false),
    /// each `{"name": <a tool>, "parameters": <its schema>}` (an `anyOf`
    /// over the tools when there are several); for a named function its
    /// parameters schema.
    pub fn tool_constraint(&self) -> Option<Constraint> {
        let schema = match self.tool_choice_mode() {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Function(name) => {
                let tool = self.tool_list().iter().find(|t| t.function.name == name)?;
                parameters_schema(&tool.function)
            }
            ToolChoice::Required => self.calls_schema(),
        };
        Some(Constraint::JsonSchema(schema.to_string()))
    }

    /// The schema of a `required` answer.
    fn calls_schema(&self) -> Value {
        let mut branches: Vec<Value> = self
            .tool_list()
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [t.function.name]},
                        "parameters": parameters_schema(&t.function),
                    },
                    "required": ["name", "parameters"],
                })
            })
            .collect();
        let items = match branches.len() {
            1 => branches.remove(0),
            _ => json!({ "anyOf": branches }),
        };
        let mut schema = json!({"type": "array", "minItems": 1, "items": items});
        if self.parallel_tool_calls == Some(false) {
            schema["maxItems"] = json!(1);
        }
        schema
    }

    /// How tool calls appear in the output: `constrained` tells whether
    /// [`Self::tool_constraint`] was applied (a `response_format` wins over
    /// it, and its output is then not parsed for calls).
    pub fn tool_output(&self, constrained: bool) -> ToolOutput {
        match self.tool_choice_mode() {
            ToolChoice::None => ToolOutput::None,
            ToolChoice::Auto => ToolOutput::Tagged,
            _ if !constrained => ToolOutput::None,
            ToolChoice::Required => ToolOutput::Json { named: None },
            ToolChoice::Function(name) => ToolOutput::Json { named: Some(name) },
        }
    }
}

/// A function's parameters schema; `{"type": "object"}` when it has none.
fn parameters_schema(function: &FunctionDef) -> Value {
    function
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}))
}

/// Reads `tool_choice`: `Ok(None)` for `null`, `Err` with the message for
/// a value of another shape.
fn read_choice(value: &Value) -> Result<Option<ToolChoice>, String> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) => match s.as_str() {
            "none" => Ok(Some(ToolChoice::None)),
            "auto" => Ok(Some(ToolChoice::Auto)),
            "required" => Ok(Some(ToolChoice::Required)),
            other => Err(format!(
                "unknown value `{other}`, expected `none`, `auto`, `required` or \
                 {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
            )),
        },
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) != Some("function") {
                return Err("an object tool_choice must have `type: \"function\"`".to_owned());
            }
            map.get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(|name| Some(ToolChoice::Function(name.to_owned())))
                .ok_or_else(|| "`function.name` must be a string".to_owned())
        }
        _ => Err("must be a string or an object".to_owned()),
    }
}

/// Validates `tools`, `tool_choice`, `chat_template_kwargs` and the tool
/// fields of messages.
pub fn check_tools(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    for (i, tool) in req.tool_list().iter().enumerate() {
        check_tool(i, tool, &req.tool_list()[..i])?;
    }
    check_choice(req)?;
    check_template_kwargs(req.chat_template_kwargs.as_ref())?;
    for (i, message) in req.messages.iter().enumerate() {
        check_message_tools(i, message)?;
    }
    Ok(())
}

/// One tool: type, name (valid, unique), parameters an object.
fn check_tool(i: usize, tool: &Tool, before: &[Tool]) -> Result<(), ApiError> {
    if tool.kind != "function" {
        let param = format!("tools[{i}].type");
        return Err(field(
            &param,
            format!("`{}` is not supported, only `function`", tool.kind),
        ));
    }
    let name = &tool.function.name;
    let param = format!("tools[{i}].function.name");
    check_name(&param, name)?;
    if before.iter().any(|t| &t.function.name == name) {
        return Err(field(&param, format!("`{name}` is declared twice")));
    }
    match &tool.function.parameters {
        None | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err(field(
            &format!("tools[{i}].function.parameters"),
            "must be a JSON schema object",
        )),
    }
}

/// A function name: 1 to 64 of `[A-Za-z0-9_-]`.
fn check_name(param: &str, name: &str) -> Result<(), ApiError> {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > MAX_TOOL_NAME || !name.chars().all(valid) {
        return Err(field(
            param,
            format!("`{name}` is not a valid function name (1 to {MAX_TOOL_NAME} of a-z, A-Z, 0-9, `_`, `-`)"),
        ));
    }
    Ok(())
}

/// `tool_choice`: a known shape; `required` and a named function need
/// tools, and the name must be one of them.
fn check_choice(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    let Some(value) = &req.tool_choice else {
        return Ok(());
    };
    let choice = read_choice(value).map_err(|m| field("tool_choice", m))?;
    match choice {
        Some(ToolChoice::Required) if req.tool_list().is_empty() => {
            Err(field("tool_choice", "`required` needs `tools`"))
        }
        Some(ToolChoice::Function(name))
            if !req.tool_list().iter().any(|t| t.function.name == name) =>
        {
            Err(field(
                "tool_choice",
                format!("function `{name}` is not one of the declared `tools`"),
            ))
        }
        _ => Ok(()),
    }
}

/// Variables a request may not set through `chat_template_kwargs`.
const RESERVED_TEMPLATE_VARS: &[&str] = &["messages", "tools", "add_generation_prompt"];

/// `chat_template_kwargs`: any object, except for the variables the
/// gateway sets itself.
fn check_template_kwargs(kwargs: Option<&Map<String, Value>>) -> Result<(), ApiError> {
    let Some(key) = kwargs.and_then(|k| {
        k.keys()
            .find(|key| RESERVED_TEMPLATE_VARS.contains(&key.as_str()))
    }) else {
        return Ok(());
    };
    Err(field(
        "chat_template_kwargs",
        format!("`{key}` is set by the request itself, not through chat_template_kwargs"),
    ))
}

/// `tool_calls` only on assistant messages (type, name and arguments
/// checked), `tool_call_id` on tool messages, `reasoning_content` only on
/// assistant messages.
fn check_message_tools(i: usize, message: &ChatMessage) -> Result<(), ApiError> {
    if message.role == Role::Tool && message.tool_call_id.as_deref().unwrap_or("").is_empty() {
        let param = format!("messages[{i}].tool_call_id");
        return Err(field(&param, "is required for `tool` messages"));
    }
    if message.role != Role::Assistant {
        for (name, present) in [
            ("tool_calls", message.tool_calls.is_some()),
            ("reasoning_content", message.reasoning_content.is_some()),
        ] {
            if present {
                let param = format!("messages[{i}].{name}");
                return Err(field(&param, "is only allowed on `assistant` messages"));
            }
        }
    }
    for (j, call) in message.tool_calls.iter().flatten().enumerate() {
        let param = format!("messages[{i}].tool_calls[{j}]");
        if call.kind != "function" {
            let param = format!("{param}.type");
            return Err(field(
                &param,
                format!("`{}` is not supported, only `function`", call.kind),
            ));
        }
        if call.function.name.is_empty() {
            return Err(field(
                &format!("{param}.function.name"),
                "must not be empty",
            ));
        }
        if call_arguments(call).is_none() {
            let param = format!("{param}.function.arguments");
            return Err(field(
                &param,
                "must be a JSON object serialised as a string",
            ));
        }
    }
    Ok(())
}

/// The arguments of an earlier call as a JSON object (what chat templates
/// iterate over); `None` when they are not one. Empty text is `{}`.
pub fn call_arguments(call: &MessageToolCall) -> Option<Value> {
    let text = call.function.arguments.trim();
    if text.is_empty() {
        return Some(Value::Object(Map::new()));
    }
    serde_json::from_str::<Value>(text)
        .ok()
        .filter(Value::is_object)
}

/// A 400 naming `param` in the message too.
fn field(param: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::bad_field(param, format!("{param}: {message}"))
}
