//! Pythonic tool calls (Llama 3.2 and Llama 4 with their pythonic
//! templates, Gemma 3 — whose tool template asks for this form, as vLLM's
//! and SGLang's Gemma 3 setups do): the whole answer is a Python list of
//! calls with keyword arguments,
//!
//! ```text
//! [get_weather(city="Paris", days=3), search(q='café', filters={"lang": ["fr"]})]
//! ```
//!
//! Llama 4 may wrap it in `<|python_start|>` … `<|python_end|>`. Argument
//! values are Python literals: strings (either quote, with escapes),
//! numbers, `True`/`False`/`None`, lists, tuples (become arrays) and dicts;
//! JSON's `true`/`false`/`null` are accepted too. Positional arguments, or
//! anything that is not a literal, make the answer plain content.

use serde_json::{Map, Number, Value};

use crate::marked::Markers;
use crate::tools::ToolCall;

/// Llama 4's opening marker for code and calls.
pub const PYTHON_START: &str = "<|python_start|>";
/// Llama 4's closing marker.
pub const PYTHON_END: &str = "<|python_end|>";

/// The special tokens this syntax is written with.
pub const TOKENS: &[&str] = &[PYTHON_START, PYTHON_END];

/// `<|python_start|>` anywhere, or `[` first.
pub const MARKERS: Markers = Markers {
    pairs: &[(PYTHON_START, None)],
    at_start: &['['],
};

/// The calls in `body`, if it is one non-empty list of calls.
pub fn parse_calls(body: &str) -> Option<Vec<ToolCall>> {
    let body = body.trim();
    let body = body.strip_suffix(PYTHON_END).unwrap_or(body);
    let mut cur = Cursor { rest: body };
    let calls = cur.calls()?;
    cur.rest.trim().is_empty().then_some(calls)
}

/// `text` if it is one Python literal (see the module docs), as JSON.
pub fn literal(text: &str) -> Option<Value> {
    let mut cur = Cursor { rest: text };
    let value = cur.value()?;
    cur.rest.trim().is_empty().then_some(value)
}

/// A position in the text being read (also FunctionGemma's reader:
/// [`crate::function_gemma`]).
pub(crate) struct Cursor<'a> {
    pub(crate) rest: &'a str,
}

impl<'a> Cursor<'a> {
    fn skip_space(&mut self) {
        self.rest = self.rest.trim_start();
    }

    /// Consumes `token` (after whitespace) if it is next.
    pub(crate) fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        match self.rest.strip_prefix(token) {
            Some(after) => {
                self.rest = after;
                true
            }
            None => false,
        }
    }

    /// Items separated by commas up to `close` (a trailing comma is
    /// allowed); the opening bracket is already consumed.
    pub(crate) fn items<T>(
        &mut self,
        close: &str,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let mut items = Vec::new();
        loop {
            if self.eat(close) {
                return Some(items);
            }
            items.push(item(self)?);
            if !self.eat(",") {
                return self.eat(close).then_some(items);
            }
        }
    }

    /// `[call, call, …]`, at least one.
    fn calls(&mut self) -> Option<Vec<ToolCall>> {
        if !self.eat("[") {
            return None;
        }
        let calls = self.items("]", Self::call)?;
        (!calls.is_empty()).then_some(calls)
    }

    /// `name(key=value, …)`; a dotted name keeps its last part.
    fn call(&mut self) -> Option<ToolCall> {
        let name = self.name()?;
        if !self.eat("(") {
            return None;
        }
        let pairs = self.items(")", |cur| {
            let key = cur.ident()?;
            cur.eat("=").then_some(())?;
            Some((key.to_owned(), cur.value()?))
        })?;
        let args: Map<String, Value> = pairs.into_iter().collect();
        Some(ToolCall::new(name, &Value::Object(args)))
    }

    /// A possibly dotted identifier; its last part.
    fn name(&mut self) -> Option<&'a str> {
        let mut last = self.ident()?;
        while self.rest.starts_with('.') {
            self.rest = &self.rest[1..];
            last = self.ident()?;
        }
        Some(last)
    }

    /// A Python identifier.
    fn ident(&mut self) -> Option<&'a str> {
        self.skip_space();
        let first = self.rest.chars().next()?;
        if !(first.is_alphabetic() || first == '_') {
            return None;
        }
        let end = self
            .rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(self.rest.len());
        let (ident, rest) = self.rest.split_at(end);
        self.rest = rest;
        Some(ident)
    }

    /// A Python literal, as JSON.
    fn value(&mut self) -> Option<Value> {
        self.skip_space();
        let first = self.rest.chars().next()?;
        match first {
            '"' | '\'' => self.string().map(Value::String),
            '[' => {
                self.rest = &self.rest[1..];
                self.items("]", Self::value).map(Value::Array)
            }
            '(' => {
                self.rest = &self.rest[1..];
                self.items(")", Self::value).map(Value::Array)
            }
            '{' => {
                self.rest = &self.rest[1..];
                let pairs = self.items("}", |cur| {
                    let key = match cur.value()? {
                        Value::String(s) => s,
                        Value::Number(n) => n.to_string(),
                        _ => return None,
                    };
                    cur.eat(":").then_some(())?;
                    Some((key, cur.value()?))
                })?;
                Some(Value::Object(pairs.into_iter().collect()))
            }
            c if c == '-' || c == '+' || c == '.' || c.is_ascii_digit() => self.number(),
            _ => {
                let word = self.ident()?;
                match word {
                    "True" | "true" => Some(Value::Bool(true)),
                    "False" | "false" => Some(Value::Bool(false)),
                    "None" | "null" => Some(Value::Null),
                    _ => None,
                }
            }
        }
    }

    /// A number: an integer when it reads as one, else a float.
    fn number(&mut self) -> Option<Value> {
        let end = self
            .rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "+-._".contains(c)))
            .unwrap_or(self.rest.len());
        let (text, rest) = self.rest.split_at(end);
        self.rest = rest;
        let text = text.replace('_', "");
        let text = text.strip_prefix('+').unwrap_or(&text);
        if let Ok(i) = text.parse::<i64>() {
            return Some(Value::from(i));
        }
        let f: f64 = text.parse().ok()?;
        Number::from_f64(f).map(Value::Number)
    }

    /// A quoted string (single, double or triple quotes) with its escapes.
    fn string(&mut self) -> Option<String> {
        let quote = self.rest.chars().next()?;
        let triple: String = std::iter::repeat_n(quote, 3).collect();
        let close: &str = if self.rest.starts_with(&triple) {
            &triple
        } else {
            &self.rest[..1]
        };
        let close = close.to_owned();
        self.rest = &self.rest[close.len()..];
        let mut out = String::new();
        let mut chars = self.rest.char_indices();
        while let Some((i, c)) = chars.next() {
            if c == '\\' {
                let (_, e) = chars.next()?;
                out.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    '0' => '\0',
                    'u' => {
                        let hex: String = (0..4)
                            .filter_map(|_| chars.next().map(|(_, h)| h))
                            .collect();
                        char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
                    }
                    other => other,
                });
            } else if self.rest[i..].starts_with(&close) {
                self.rest = &self.rest[i + close.len()..];
                return Some(out);
            } else {
                out.push(c);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(body: &str) -> Vec<(String, Value)> {
        parse_calls(body)
            .expect("calls")
            .into_iter()
            .map(|c| (c.name, serde_json::from_str(&c.arguments).expect("json")))
            .collect()
    }

    #[test]
    fn literals_become_json() {
        let body = r#"[get_weather(city="Paris", days=3), search(q='caf\'é\n', limit=-2.5, exact=True, tags=["a", 'b'], pair=(1, 2), opts={'lang': None, 1: false}), now()]"#;
        assert_eq!(
            parsed(body),
            [
                ("get_weather".into(), json!({"city": "Paris", "days": 3})),
                (
                    "search".into(),
                    json!({"q": "caf'é\n", "limit": -2.5, "exact": true, "tags": ["a", "b"],
                           "pair": [1, 2], "opts": {"lang": null, "1": false}})
                ),
                ("now".into(), json!({})),
            ]
        );
    }

    #[test]
    fn llama4_markers_triple_quotes_and_dotted_names() {
        let body = "[functions.run(code=\"\"\"print(\"hi\")\"\"\",)]<|python_end|>";
        assert_eq!(
            parsed(body),
            [("run".into(), json!({"code": "print(\"hi\")"}))]
        );
    }

    #[test]
    fn refuses_what_is_not_a_call_list() {
        for body in [
            "",
            "[]",
            "[1, 2, 3]",
            "[f(1)]",
            "[f(a=1)",
            "[f(a=x)]",
            "[f(a='open)]",
            "[f(a=1)] and then text",
            "[see the docs](http://example.com)",
        ] {
            assert_eq!(parse_calls(body), None, "{body:?}");
        }
    }
}
