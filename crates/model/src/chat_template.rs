//! Chat templates: Hugging Face Jinja templates rendered with minijinja.
//!
//! The environment mirrors what `transformers` sets up for
//! `apply_chat_template`: `trim_blocks` and `lstrip_blocks` on, Python string,
//! dict and list methods (`.strip()`, `.startswith()`, `.items()`, ...) through
//! `minijinja-contrib`'s pycompat, a `raise_exception(msg)` function, and a
//! `tojson` filter that formats like Python's `json.dumps(ensure_ascii=False)`
//! (`", "` and `": "` separators, optional `indent`, no HTML escaping).
//! Values are immutable in minijinja, so in-place `list.append` is not
//! available; templates that build lists with `+` work. `transformers`'
//! `{% generation %}…{% endgeneration %}` blocks (which mark the
//! assistant's tokens for training masks, as in LLaVA's templates) render
//! their body, as they do in `apply_chat_template`.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::Serialize;
use serde_json::Map;

use crate::ModelError;

const NAME: &str = "chat_template";

/// A compiled chat template. Compile once with [`ChatTemplate::new`], then
/// [`ChatTemplate::render`] as often as needed (it is `Send + Sync`).
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; syntax errors are reported with their line.
    pub fn new(source: &str) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        env.set_syntax(hf_syntax()?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, generation_blocks(source))
            .map_err(|e| ModelError::template(&e))?;
        Ok(ChatTemplate { env })
    }

    /// Renders `messages` (a JSON list of `{role, content}`), appending the
    /// assistant prompt when `add_generation_prompt` is set. `extra` (a JSON
    /// object) adds variables such as `tools`, `bos_token` or `eos_token`.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: Option<&serde_json::Value>,
    ) -> Result<String, ModelError> {
        let extra = match extra {
            None => None,
            Some(serde_json::Value::Object(m)) => Some(m),
            Some(_) => {
                return Err(ModelError::Template {
                    message: "extra variables must be a JSON object".into(),
                })
            }
        };
        let variables = Variables {
            extra,
            messages,
            add_generation_prompt,
        };
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ModelError::template(&e))?;
        template
            .render(Value::from(minijinja::value::Serde(&variables)))
            .map_err(|e| ModelError::template(&e))
    }
}

/// A render's variables, borrowed from the caller: `extra`'s, then
/// `messages` and `add_generation_prompt`, which win over an `extra`
/// variable of the same name.
struct Variables<'a> {
    extra: Option<&'a Map<String, serde_json::Value>>,
    messages: &'a serde_json::Value,
    add_generation_prompt: bool,
}

impl Serialize for Variables<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        const OWN: [&str; 2] = ["messages", "add_generation_prompt"];
        let mut map = serializer.serialize_map(None)?;
        let extra = self.extra.into_iter().flatten();
        for (key, value) in extra.filter(|(key, _)| !OWN.contains(&key.as_str())) {
            map.serialize_entry(key, value)?;
        }
        map.serialize_entry("messages", self.messages)?;
        map.serialize_entry("add_generation_prompt", &self.add_generation_prompt)?;
        map.end()
    }
}

/// `source` with each `{% generation %}` tag written `{% if true %}` and
/// each `{% endgeneration %}` `{% endif %}`, whitespace control kept:
/// minijinja has no such tag, and outside training masks it only renders
/// its body.
fn generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at + 2..];
        let Some(end) = tag.find("%}") else {
            out.push_str("{%");
            rest = tag;
            break;
        };
        out.push_str(&block_tag(&tag[..end]));
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// One block tag, `inner` the text between `{%` and `%}`: a generation
/// tag rewritten, any other as it is.
fn block_tag(inner: &str) -> String {
    let open = if inner.starts_with(['-', '+']) {
        &inner[..1]
    } else {
        ""
    };
    let body = &inner[open.len()..];
    let close = if body.ends_with(['-', '+']) {
        &body[body.len() - 1..]
    } else {
        ""
    };
    match body[..body.len() - close.len()].trim() {
        "generation" => format!("{{%{open} if true {close}%}}"),
        "endgeneration" => format!("{{%{open} endif {close}%}}"),
        _ => format!("{{%{inner}%}}"),
    }
}

/// The whitespace rules `transformers` compiles chat templates with.
fn hf_syntax() -> Result<SyntaxConfig, ModelError> {
    SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| ModelError::template(&e))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson` as `transformers` defines it: `json.dumps(value,
/// ensure_ascii=False, indent=indent)`.
fn tojson(_state: &State, value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted for compatibility; output is always as with ensure_ascii=False.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let result = match indent {
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PyFormatter,
        )),
        Some(n) => {
            let pad = vec![b' '; n];
            let formatter = serde_json::ser::PrettyFormatter::with_indent(&pad);
            value.serialize(&mut serde_json::Serializer::with_formatter(
                &mut out, formatter,
            ))
        }
    };
    result.map_err(|e| Error::new(ErrorKind::BadSerialization, "tojson failed").with_source(e))?;
    let text = String::from_utf8(out).map_err(|e| {
        Error::new(ErrorKind::BadSerialization, "tojson produced invalid UTF-8").with_source(e)
    })?;
    Ok(Value::from_safe_string(text))
}

/// Python's default `json.dumps` separators: `", "` between items, `": "` after keys.
struct PyFormatter;

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// LLaVA's templates wrap the assistant's text in `{% generation %}`:
    /// it renders as its body, whitespace control kept.
    #[test]
    fn generation_blocks_render_their_body() {
        let source = "{% for m in messages %}{%- generation -%} {{ m.content }} {% endgeneration %}|{% endfor %}";
        assert_eq!(
            generation_blocks(source),
            "{% for m in messages %}{%- if true -%} {{ m.content }} {% endif %}|{% endfor %}"
        );
        let template = ChatTemplate::new(source).unwrap();
        let messages = serde_json::json!([{"content": "a"}, {"content": "b"}]);
        assert_eq!(template.render(&messages, false, None).unwrap(), "a |b |");
        assert_eq!(generation_blocks("50%} {% x"), "50%} {% x");
    }
}
