//! Constrained decoding: what a request asks the worker's sampler to obey.
//!
//! A request carries at most one constraint. It comes from
//! `response_format` (`json_object`, `json_schema`), from the extension
//! fields `regex`, `ebnf` (alias `grammar`) and `structural_tag`, or from
//! `tool_choice` (`required` or a named function), which the gateway turns
//! into a JSON schema built from the tools' parameter schemas. Each variant
//! maps one to one onto the `constraint` oneof of the worker protocol's
//! `SamplingParams`.

/// One decoding constraint, as the worker receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// A JSON schema, serialised; the output is one document valid for it.
    JsonSchema(String),
    /// A regular expression the whole output matches.
    Regex(String),
    /// An EBNF grammar the output is a sentence of.
    Ebnf(String),
    /// A structural tag specification (JSON), passed through as sent.
    StructuralTag(String),
}
