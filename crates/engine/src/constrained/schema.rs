//! JSON documents valid for a JSON Schema, generated from the schema.
//!
//! [`SchemaGuide::compile`] turns the schema into a graph of [`Node`]s:
//! `$ref`s to `#/...` (pydantic's `#/$defs/...`, older `#/definitions/...`)
//! are resolved once and may recurse; `allOf`, and keywords standing
//! beside `$ref`/`anyOf`/`oneOf`, are merged into one schema; a list of
//! types becomes a choice. What no document can satisfy (minimum above
//! maximum, a required property `additionalProperties: false` forbids, a
//! `false` schema…) and keywords this generator does not follow (`not`,
//! `if`, `contains`, `dependentRequired`…) are refused with the reason.
//!
//! [`SchemaGuide::generate`] then writes one compact document, each free
//! choice (which optional properties, how many items, which branch, which
//! number or letters) drawn from the caller's [`Rng`]. Past a few levels of
//! nesting it takes the smallest choices (no optional properties, fewest
//! items, scalar branches first), so recursive schemas end.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::pattern::PatternGuide;
use super::Rng;

/// Nesting past which the smallest choices are taken.
const SOFT_DEPTH: usize = 4;
/// Nesting a document may not exceed.
const HARD_DEPTH: usize = 32;
/// Nesting of schemas inside schemas the compiler follows.
const MAX_SCHEMA_DEPTH: usize = 64;
/// Span of a number drawn with only one bound (or none).
const DEFAULT_SPAN: i128 = 100;
/// Keywords that do not constrain the value.
const ANNOTATIONS: [&str; 16] = [
    "title",
    "description",
    "default",
    "examples",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$schema",
    "$id",
    "$anchor",
    "$defs",
    "definitions",
    "contentEncoding",
    "contentMediaType",
    "discriminator",
];
/// Keywords whose constraint the generator does not follow.
const REFUSED: [&str; 9] = [
    "not",
    "if",
    "contains",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "$dynamicRef",
    "$recursiveRef",
    "propertyNames",
];
/// Names of the properties written beyond the listed ones.
const EXTRA_KEYS: [&str; 6] = ["name", "value", "count", "label", "note", "kind"];
/// Letters free strings are drawn from.
const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";

/// A compiled schema that documents can be drawn from.
#[derive(Debug, Clone)]
pub struct SchemaGuide {
    nodes: Vec<Node>,
    root: usize,
}

/// One schema, compiled; children are indices into the guide's nodes.
#[derive(Debug, Clone)]
enum Node {
    /// Any JSON value.
    Any,
    Null,
    Boolean,
    Integer {
        min: i64,
        max: i64,
        step: i64,
    },
    Number {
        min: f64,
        max: f64,
        open_min: bool,
        open_max: bool,
        step: Option<f64>,
    },
    String {
        min: usize,
        max: usize,
        shape: StringShape,
    },
    /// One of these values (`enum`, `const`), serialised.
    Choice(Vec<String>),
    Array {
        prefix: Vec<usize>,
        /// `None`: no items past the prefix.
        items: Option<usize>,
        min: usize,
        max: usize,
        unique: bool,
    },
    Object {
        props: Vec<Prop>,
        /// Schema of properties not listed; `None`: none allowed.
        extra: Option<usize>,
        min: usize,
        max: usize,
    },
    /// One of several schemas (`anyOf`, `oneOf`, a list of types).
    OneOf(Vec<usize>),
}

/// How a string's characters are drawn.
#[derive(Debug, Clone)]
enum StringShape {
    Letters,
    Pattern(Box<PatternGuide>),
    Format(Format),
}

/// The `format`s written as such; others are ignored.
#[derive(Debug, Clone, Copy)]
enum Format {
    DateTime,
    Date,
    Time,
    Email,
    Uri,
    Uuid,
    Ipv4,
    Hostname,
}

/// One property of an object schema.
#[derive(Debug, Clone)]
struct Prop {
    name: String,
    node: usize,
    required: bool,
}

impl SchemaGuide {
    /// Compiles a serialised schema; `Err` says why no document can be
    /// drawn from it.
    pub fn compile(text: &str) -> Result<Self, String> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| format!("the schema is not valid JSON: {e}"))?;
        let mut compiler = Compiler {
            root: &root,
            nodes: Vec::new(),
            refs: HashMap::new(),
            depth: 0,
        };
        let root = compiler.compile(&root)?;
        Ok(SchemaGuide {
            nodes: compiler.nodes,
            root,
        })
    }

    /// One compact document valid for the schema, at most about `budget`
    /// bytes long.
    pub fn generate(&self, rng: &mut Rng, budget: usize) -> Result<String, String> {
        let mut writer = Writer {
            nodes: &self.nodes,
            rng,
            out: String::new(),
            budget,
        };
        writer.value(self.root, 0)?;
        Ok(writer.out)
    }
}

struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    /// Compiled `$ref` targets, by reference.
    refs: HashMap<String, usize>,
    depth: usize,
}

impl<'a> Compiler<'a> {
    fn push(&mut self, node: Node) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn compile(&mut self, schema: &Value) -> Result<usize, String> {
        if self.depth >= MAX_SCHEMA_DEPTH {
            return Err(format!(
                "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (or refers to itself beside other keywords)"
            ));
        }
        self.depth += 1;
        let node = match schema {
            Value::Bool(true) => Ok(self.push(Node::Any)),
            Value::Bool(false) => Err("a `false` schema admits no value".to_owned()),
            Value::Object(map) => self.object_schema(map),
            other => Err(format!(
                "a schema must be an object or a boolean, got {other}"
            )),
        };
        self.depth -= 1;
        node
    }

    fn object_schema(&mut self, map: &Map<String, Value>) -> Result<usize, String> {
        if let Some(key) = REFUSED.iter().find(|k| map.contains_key(**k)) {
            return Err(format!("the keyword `{key}` is not supported"));
        }
        if let Some(reference) = map.get("$ref") {
            let reference = reference
                .as_str()
                .ok_or("`$ref` must be a string")?
                .to_owned();
            let siblings = without(map, "$ref");
            if !constrains(&siblings) {
                return self.reference(&reference);
            }
            let target = self.expand(self.resolve(&reference)?)?;
            return self.compile(&Value::Object(merge(target, &siblings)?));
        }
        if let Some(all) = map.get("allOf") {
            let mut merged = without(map, "allOf");
            for member in all.as_array().ok_or("`allOf` must be an array")? {
                merged = merge(merged, &self.expand(member)?)?;
            }
            return self.compile(&Value::Object(merged));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(branches) = map.get(key) {
                return self.branches(key, branches, without(map, key));
            }
        }
        if let Some(value) = map.get("const") {
            return Ok(self.push(Node::Choice(vec![value.to_string()])));
        }
        let types = types(map)?;
        if let Some(values) = map.get("enum") {
            return self.choice(values, &types);
        }
        match types.as_slice() {
            [] => Ok(self.push(Node::Any)),
            [one] => self.typed(one, map),
            several => {
                let nodes = several
                    .iter()
                    .map(|t| self.typed(t, map))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(self.push(Node::OneOf(nodes)))
            }
        }
    }

    /// `$ref` without other constraints: compiled once, so it may recurse.
    fn reference(&mut self, reference: &str) -> Result<usize, String> {
        if let Some(&node) = self.refs.get(reference) {
            return Ok(node);
        }
        let target = self.resolve(reference)?;
        let slot = self.push(Node::Any);
        self.refs.insert(reference.to_owned(), slot);
        let compiled = self.compile(target)?;
        self.nodes[slot] = self.nodes[compiled].clone();
        Ok(slot)
    }

    /// The schema a local reference points at.
    fn resolve(&self, reference: &str) -> Result<&'a Value, String> {
        let pointer = reference.strip_prefix('#').ok_or_else(|| {
            format!(
                "`$ref` {reference:?}: only references inside the schema (`#/...`) are supported"
            )
        })?;
        self.root
            .pointer(pointer)
            .ok_or_else(|| format!("`$ref` {reference:?} points at nothing in the schema"))
    }

    /// A schema as keywords, with a leading `$ref` replaced by its target.
    fn expand(&self, schema: &Value) -> Result<Map<String, Value>, String> {
        let mut current = schema;
        let mut extra = Map::new();
        for _ in 0..MAX_SCHEMA_DEPTH {
            let map = match current {
                Value::Bool(true) => return Ok(extra),
                Value::Object(map) => map,
                _ => return Err(format!("`{current}` cannot be combined with other schemas")),
            };
            match map.get("$ref").and_then(Value::as_str) {
                Some(reference) => {
                    extra = merge(without(map, "$ref"), &extra)?;
                    current = self.resolve(reference)?;
                }
                None => return merge(map.clone(), &extra),
            }
        }
        Err("`$ref`s refer to each other in a loop".to_owned())
    }

    /// `anyOf`/`oneOf`: each branch, with the keywords beside it merged in.
    fn branches(
        &mut self,
        key: &str,
        branches: &Value,
        siblings: Map<String, Value>,
    ) -> Result<usize, String> {
        let list = branches
            .as_array()
            .filter(|l| !l.is_empty())
            .ok_or_else(|| format!("`{key}` must be a non-empty array"))?;
        let constrained = constrains(&siblings);
        let mut nodes = Vec::with_capacity(list.len());
        for branch in list {
            let node = if constrained {
                let merged = merge(siblings.clone(), &self.expand(branch)?)?;
                self.compile(&Value::Object(merged))?
            } else {
                self.compile(branch)?
            };
            nodes.push(node);
        }
        Ok(self.push(Node::OneOf(nodes)))
    }

    /// `enum`, keeping the values of the schema's type(s).
    fn choice(&mut self, values: &Value, types: &[String]) -> Result<usize, String> {
        let values = values.as_array().ok_or("`enum` must be an array")?;
        let kept: Vec<String> = values
            .iter()
            .filter(|v| types.is_empty() || types.iter().any(|t| has_type(v, t)))
            .map(Value::to_string)
            .collect();
        if kept.is_empty() {
            return Err("no `enum` value has the schema's type".to_owned());
        }
        Ok(self.push(Node::Choice(kept)))
    }

    fn typed(&mut self, kind: &str, map: &Map<String, Value>) -> Result<usize, String> {
        let node = match kind {
            "null" => Node::Null,
            "boolean" => Node::Boolean,
            "integer" => integer(map)?,
            "number" => number(map)?,
            "string" => string(map)?,
            "array" => self.array(map)?,
            "object" => self.object(map)?,
            other => return Err(format!("unknown type `{other}`")),
        };
        Ok(self.push(node))
    }

    fn array(&mut self, map: &Map<String, Value>) -> Result<Node, String> {
        let mut prefix = Vec::new();
        if let Some(list) = map.get("prefixItems") {
            for schema in list.as_array().ok_or("`prefixItems` must be an array")? {
                prefix.push(self.compile(schema)?);
            }
        }
        let rest = match map.get("items") {
            Some(Value::Array(list)) => {
                // Draft 4 tuples: `items` is the prefix.
                for schema in list {
                    prefix.push(self.compile(schema)?);
                }
                map.get("additionalItems")
            }
            other => other,
        };
        let items = match rest {
            None | Some(Value::Bool(true)) => Some(self.push(Node::Any)),
            Some(Value::Bool(false)) => None,
            Some(schema) => Some(self.compile(schema)?),
        };
        let min = count(map, "minItems")?.unwrap_or(0);
        let mut max = count(map, "maxItems")?.unwrap_or(usize::MAX);
        if items.is_none() {
            max = max.min(prefix.len());
        }
        if min > max {
            return Err(format!(
                "an array needs at least {min} items but may hold at most {max}"
            ));
        }
        let unique = map.get("uniqueItems") == Some(&Value::Bool(true));
        Ok(Node::Array {
            prefix,
            items,
            min,
            max,
            unique,
        })
    }

    fn object(&mut self, map: &Map<String, Value>) -> Result<Node, String> {
        let required: Vec<&str> = match map.get("required") {
            Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err("`required` must be an array of strings".to_owned()),
            None => Vec::new(),
        };
        let extra = match map.get("additionalProperties") {
            None | Some(Value::Bool(true)) => Some(self.push(Node::Any)),
            Some(Value::Bool(false)) => None,
            Some(schema) => Some(self.compile(schema)?),
        };
        let mut props = Vec::new();
        if let Some(listed) = map.get("properties") {
            let listed = listed.as_object().ok_or("`properties` must be an object")?;
            for (name, schema) in listed {
                props.push(Prop {
                    name: name.clone(),
                    node: self.compile(schema)?,
                    required: required.contains(&name.as_str()),
                });
            }
        }
        for name in required {
            if props.iter().any(|p| p.name == name) {
                continue;
            }
            let node = extra.ok_or_else(|| {
                format!("`{name}` is required but not among `properties`, and additionalProperties is false")
            })?;
            props.push(Prop {
                name: name.to_owned(),
                node,
                required: true,
            });
        }
        let min = count(map, "minProperties")?.unwrap_or(0);
        let max = count(map, "maxProperties")?.unwrap_or(usize::MAX);
        let needed = props.iter().filter(|p| p.required).count();
        if needed > max || min > max {
            return Err(format!(
                "an object needs at least {} properties but may hold at most {max}",
                needed.max(min)
            ));
        }
        if extra.is_none() && props.len() < min {
            return Err(format!(
                "an object needs at least {min} properties but only {} are allowed",
                props.len()
            ));
        }
        Ok(Node::Object {
            props,
            extra,
            min,
            max,
        })
    }
}

/// `map` without `key`.
fn without(map: &Map<String, Value>, key: &str) -> Map<String, Value> {
    let mut rest = map.clone();
    rest.remove(key);
    rest
}

/// Whether `map` holds a keyword that constrains values.
fn constrains(map: &Map<String, Value>) -> bool {
    map.keys().any(|k| !ANNOTATIONS.contains(&k.as_str()))
}

/// The schema's types: `type` as a list, or inferred from its keywords
/// (none: any value).
fn types(map: &Map<String, Value>) -> Result<Vec<String>, String> {
    match map.get("type") {
        Some(Value::String(one)) => return Ok(vec![one.clone()]),
        Some(Value::Array(list)) => {
            return list
                .iter()
                .map(|t| t.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| "`type` must hold type names".to_owned())
        }
        Some(other) => return Err(format!("`type` must be a string or a list, got {other}")),
        None => {}
    }
    let has = |keys: &[&str]| keys.iter().any(|k| map.contains_key(*k));
    let inferred = if has(&[
        "properties",
        "required",
        "additionalProperties",
        "minProperties",
        "maxProperties",
    ]) {
        "object"
    } else if has(&[
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "uniqueItems",
    ]) {
        "array"
    } else if has(&["minLength", "maxLength", "pattern", "format"]) {
        "string"
    } else if has(&[
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    ]) {
        "number"
    } else {
        return Ok(Vec::new());
    };
    Ok(vec![inferred.to_owned()])
}

/// Whether `value` is of JSON Schema type `kind`.
fn has_type(value: &Value, kind: &str) -> bool {
    match kind {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => false,
    }
}

/// A non-negative integer keyword.
fn count(map: &Map<String, Value>, key: &str) -> Result<Option<usize>, String> {
    match map.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
            .ok_or_else(|| format!("`{key}` must be a non-negative integer")),
    }
}

/// A numeric keyword.
fn float(map: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    match map.get(key) {
        None | Some(Value::Bool(_)) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|f| f.is_finite())
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be a number")),
    }
}

/// The lower and upper bounds of a number schema, each with whether it is
/// exclusive (numeric `exclusiveMinimum`, or draft 4's boolean form).
fn bounds(map: &Map<String, Value>) -> Result<[Option<(f64, bool)>; 2], String> {
    let side = |inclusive: &str, exclusive: &str| -> Result<Option<(f64, bool)>, String> {
        let flag = map.get(exclusive) == Some(&Value::Bool(true));
        let a = float(map, inclusive)?.map(|v| (v, flag));
        let b = float(map, exclusive)?.map(|v| (v, true));
        Ok(match (a, b) {
            (Some(a), Some(b)) if inclusive == "minimum" => Some(if b.0 >= a.0 { b } else { a }),
            (Some(a), Some(b)) => Some(if b.0 <= a.0 { b } else { a }),
            (a, b) => a.or(b),
        })
    };
    Ok([
        side("minimum", "exclusiveMinimum")?,
        side("maximum", "exclusiveMaximum")?,
    ])
}

fn integer(map: &Map<String, Value>) -> Result<Node, String> {
    let [lo, hi] = bounds(map)?;
    let lo = lo.map(|(v, open)| {
        let c = v.ceil();
        (if open && c == v { c + 1.0 } else { c }) as i128
    });
    let hi = hi.map(|(v, open)| {
        let f = v.floor();
        (if open && f == v { f - 1.0 } else { f }) as i128
    });
    let (lo, hi) = match (lo, hi) {
        (Some(lo), Some(hi)) => (lo, hi),
        (Some(lo), None) => (lo, lo + DEFAULT_SPAN),
        (None, Some(hi)) => (hi - DEFAULT_SPAN, hi),
        (None, None) => (0, DEFAULT_SPAN),
    };
    let step = match float(map, "multipleOf")? {
        None => 1,
        Some(s) if s >= 1.0 && s.fract() == 0.0 && s < 1e15 => s as i128,
        Some(s) => return Err(format!("`multipleOf` {s} on an integer is not supported")),
    };
    let first = lo.div_euclid(step) * step + if lo.rem_euclid(step) == 0 { 0 } else { step };
    if first > hi {
        return Err(format!(
            "no integer between {lo} and {hi} (multiple of {step})"
        ));
    }
    let fit = |v: i128| i64::try_from(v).map_err(|_| format!("{v} is beyond 64-bit integers"));
    Ok(Node::Integer {
        min: fit(first)?,
        max: fit(hi)?,
        step: fit(step)?,
    })
}

fn number(map: &Map<String, Value>) -> Result<Node, String> {
    let [lo, hi] = bounds(map)?;
    let span = DEFAULT_SPAN as f64;
    let ((min, open_min), (max, open_max)) = match (lo, hi) {
        (Some(lo), Some(hi)) => (lo, hi),
        (Some(lo), None) => (lo, (lo.0 + span, false)),
        (None, Some(hi)) => ((hi.0 - span, false), hi),
        (None, None) => ((0.0, false), (span, false)),
    };
    if min > max || (min == max && (open_min || open_max)) {
        return Err(format!("no number between {min} and {max}"));
    }
    let step = float(map, "multipleOf")?;
    if let Some(step) = step {
        if step <= 0.0 {
            return Err("`multipleOf` must be greater than 0".to_owned());
        }
        if multiples(min, max, open_min, open_max, step).is_none() {
            return Err(format!("no multiple of {step} between {min} and {max}"));
        }
    }
    Ok(Node::Number {
        min,
        max,
        open_min,
        open_max,
        step,
    })
}

/// The first and last multiplier `k` with `k * step` inside the bounds.
fn multiples(min: f64, max: f64, open_min: bool, open_max: bool, step: f64) -> Option<(f64, f64)> {
    let mut first = (min / step).ceil();
    if open_min && first * step <= min {
        first += 1.0;
    }
    let mut last = (max / step).floor();
    if open_max && last * step >= max {
        last -= 1.0;
    }
    (first <= last && first.is_finite() && last.is_finite()).then_some((first, last))
}

fn string(map: &Map<String, Value>) -> Result<Node, String> {
    let min = count(map, "minLength")?.unwrap_or(0);
    let max = count(map, "maxLength")?.unwrap_or(usize::MAX);
    if min > max {
        return Err(format!(
            "a string needs at least {min} characters but may hold at most {max}"
        ));
    }
    let shape = if let Some(pattern) = map.get("pattern") {
        let pattern = pattern.as_str().ok_or("`pattern` must be a string")?;
        StringShape::Pattern(Box::new(PatternGuide::compile(pattern)?))
    } else {
        match map.get("format").and_then(Value::as_str).and_then(format) {
            Some(f) => StringShape::Format(f),
            None => StringShape::Letters,
        }
    };
    Ok(Node::String { min, max, shape })
}

fn format(name: &str) -> Option<Format> {
    Some(match name {
        "date-time" => Format::DateTime,
        "date" => Format::Date,
        "time" => Format::Time,
        "email" | "idn-email" => Format::Email,
        "uri" | "url" | "iri" => Format::Uri,
        "uuid" => Format::Uuid,
        "ipv4" => Format::Ipv4,
        "hostname" | "idn-hostname" => Format::Hostname,
        _ => return None,
    })
}

/// Merges `extra`'s keywords into `base` (both must hold): properties
/// and required lists are joined, bounds take the tighter value, types
/// their intersection; other keywords take `extra`'s value.
fn merge(
    mut base: Map<String, Value>,
    extra: &Map<String, Value>,
) -> Result<Map<String, Value>, String> {
    for (key, value) in extra {
        let merged = match (key.as_str(), base.get(key)) {
            (_, None) => value.clone(),
            ("properties", Some(Value::Object(mine))) => {
                let mut props = mine.clone();
                for (name, schema) in value.as_object().into_iter().flatten() {
                    let both = match props.get(name) {
                        Some(old) => serde_json::json!({"allOf": [old, schema]}),
                        None => schema.clone(),
                    };
                    props.insert(name.clone(), both);
                }
                Value::Object(props)
            }
            ("required", Some(Value::Array(mine))) => {
                let mut all = mine.clone();
                for name in value.as_array().into_iter().flatten() {
                    if !all.contains(name) {
                        all.push(name.clone());
                    }
                }
                Value::Array(all)
            }
            ("type", Some(mine)) => intersect_types(mine, value)?,
            (
                "minimum" | "exclusiveMinimum" | "minLength" | "minItems" | "minProperties",
                Some(mine),
            ) => tighter(mine, value, f64::max),
            (
                "maximum" | "exclusiveMaximum" | "maxLength" | "maxItems" | "maxProperties",
                Some(mine),
            ) => tighter(mine, value, f64::min),
            _ => value.clone(),
        };
        base.insert(key.clone(), merged);
    }
    Ok(base)
}

/// The bound `pick` chooses of two numeric keywords.
fn tighter(a: &Value, b: &Value, pick: fn(f64, f64) -> f64) -> Value {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if pick(x, y) == x => a.clone(),
        _ => b.clone(),
    }
}

/// The types both `type` keywords allow (`integer` is a `number`).
fn intersect_types(a: &Value, b: &Value) -> Result<Value, String> {
    let list = |v: &Value| -> Vec<String> {
        match v {
            Value::String(s) => vec![s.clone()],
            Value::Array(l) => l
                .iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    };
    let (a, b) = (list(a), list(b));
    let admits = |types: &[String], t: &str| {
        types
            .iter()
            .any(|u| u == t || (u == "number" && t == "integer"))
    };
    let both: Vec<Value> = a
        .iter()
        .chain(b.iter())
        .filter(|t| admits(&a, t) && admits(&b, t))
        .fold(Vec::<String>::new(), |mut acc, t| {
            if !acc.contains(t) {
                acc.push(t.clone());
            }
            acc
        })
        .into_iter()
        .map(Value::String)
        .collect();
    if both.is_empty() {
        return Err("combined schemas allow no common type".to_owned());
    }
    Ok(Value::Array(both))
}

/// Writes one document for a compiled schema.
struct Writer<'a, 'r> {
    nodes: &'a [Node],
    rng: &'r mut Rng,
    out: String,
    budget: usize,
}

impl Writer<'_, '_> {
    fn value(&mut self, node: usize, depth: usize) -> Result<(), String> {
        if depth > HARD_DEPTH {
            return Err(format!(
                "the schema forces documents nested deeper than {HARD_DEPTH} levels"
            ));
        }
        if self.out.len() > self.budget {
            return Err(format!(
                "the schema's documents are larger than {} bytes",
                self.budget
            ));
        }
        let small = depth >= SOFT_DEPTH;
        match &self.nodes[node] {
            Node::Any => self.any(small),
            Node::Null => self.out.push_str("null"),
            Node::Boolean => self.boolean(),
            &Node::Integer { min, max, step } => self.integer(min, max, step),
            &Node::Number {
                min,
                max,
                open_min,
                open_max,
                step,
            } => self.number(min, max, open_min, open_max, step)?,
            Node::String { min, max, shape } => self.string(*min, *max, shape)?,
            Node::Choice(values) => {
                let pick = self.rng.below(values.len() as u64) as usize;
                self.out.push_str(&values[pick]);
            }
            Node::Array {
                prefix,
                items,
                min,
                max,
                unique,
            } => self.array(prefix, *items, (*min, *max), *unique, depth)?,
            Node::Object {
                props,
                extra,
                min,
                max,
            } => self.object(props, *extra, (*min, *max), depth)?,
            Node::OneOf(branches) => {
                let pick = self.branch(branches, small);
                self.value(pick, depth + 1)?;
            }
        }
        Ok(())
    }

    fn any(&mut self, small: bool) {
        let pick = if small { 0 } else { self.rng.below(4) };
        match pick {
            0 => self.out.push_str("null"),
            1 => self.boolean(),
            2 => self.integer(0, DEFAULT_SPAN as i64, 1),
            _ => self.letters(3, 8),
        }
    }

    fn boolean(&mut self) {
        let value = if self.rng.below(2) == 0 {
            "false"
        } else {
            "true"
        };
        self.out.push_str(value);
    }

    fn integer(&mut self, min: i64, max: i64, step: i64) {
        let steps = (i128::from(max) - i128::from(min)) / i128::from(step);
        let k = self
            .rng
            .between(0, u64::try_from(steps).unwrap_or(u64::MAX));
        let value = i128::from(min) + i128::from(k) * i128::from(step);
        self.out.push_str(&value.to_string());
    }

    fn number(
        &mut self,
        min: f64,
        max: f64,
        open_min: bool,
        open_max: bool,
        step: Option<f64>,
    ) -> Result<(), String> {
        let inside =
            |v: f64| (v > min || (!open_min && v == min)) && (v < max || (!open_max && v == max));
        let value = match step {
            Some(step) => {
                let (first, last) = multiples(min, max, open_min, open_max, step)
                    .ok_or_else(|| format!("no multiple of {step} between {min} and {max}"))?;
                let span = (last - first).min(DEFAULT_SPAN as f64) as u64;
                (first + self.rng.between(0, span) as f64) * step
            }
            None => {
                let r = self.rng.between(0, 100) as f64 / 100.0;
                let v = ((min + (max - min) * r) * 100.0).round() / 100.0;
                if inside(v) {
                    v
                } else {
                    min + (max - min) / 2.0
                }
            }
        };
        let number = serde_json::Number::from_f64(value)
            .filter(|_| inside(value) || step.is_some())
            .ok_or_else(|| format!("cannot write a number between {min} and {max}"))?;
        self.out.push_str(&number.to_string());
        Ok(())
    }

    fn string(&mut self, min: usize, max: usize, shape: &StringShape) -> Result<(), String> {
        if min > self.budget {
            return Err(format!(
                "a string of at least {min} characters is larger than {} bytes",
                self.budget
            ));
        }
        let text = match shape {
            StringShape::Letters => {
                let top = max.min(min.max(3) + 6);
                return {
                    self.letters(min, top);
                    Ok(())
                };
            }
            StringShape::Pattern(guide) => self.patterned(guide, min, max)?,
            StringShape::Format(format) => self.formatted(*format),
        };
        let chars = text.chars().count();
        if chars < min || chars > max {
            return Err(format!(
                "cannot write a string of {min} to {max} characters in this format"
            ));
        }
        self.out
            .push_str(&serde_json::to_string(&text).map_err(|e| e.to_string())?);
        Ok(())
    }

    /// A quoted string of `min..=max` lowercase letters.
    fn letters(&mut self, min: usize, max: usize) {
        let len = self.rng.between(min as u64, max as u64);
        self.out.push('"');
        for _ in 0..len {
            let pick = self.rng.below(LETTERS.len() as u64) as usize;
            self.out.push(char::from(LETTERS[pick]));
        }
        self.out.push('"');
    }

    /// A string matching `guide` with a length in `min..=max`.
    fn patterned(
        &mut self,
        guide: &PatternGuide,
        min: usize,
        max: usize,
    ) -> Result<String, String> {
        for _ in 0..16 {
            let text = guide.generate(self.rng, self.budget)?;
            if (min..=max).contains(&text.chars().count()) {
                return Ok(text);
            }
        }
        Err(format!(
            "cannot write a string matching the pattern with {min} to {max} characters"
        ))
    }

    fn formatted(&mut self, format: Format) -> String {
        let mut n = |below: u64| self.rng.below(below);
        match format {
            Format::DateTime => format!(
                "20{:02}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                n(30),
                n(12) + 1,
                n(28) + 1,
                n(24),
                n(60),
                n(60)
            ),
            Format::Date => format!("20{:02}-{:02}-{:02}", n(30), n(12) + 1, n(28) + 1),
            Format::Time => format!("{:02}:{:02}:{:02}Z", n(24), n(60), n(60)),
            Format::Email => format!("user{}@example.com", n(1000)),
            Format::Uri => format!("https://example.com/item/{}", n(1000)),
            Format::Uuid => format!(
                "{:08x}-{:04x}-4{:03x}-{:x}{:03x}-{:012x}",
                n(1 << 32),
                n(1 << 16),
                n(1 << 12),
                8 + n(4),
                n(1 << 12),
                n(1 << 48)
            ),
            Format::Ipv4 => format!("10.{}.{}.{}", n(256), n(256), n(256)),
            Format::Hostname => format!("host{}.example.com", n(1000)),
        }
    }

    fn array(
        &mut self,
        prefix: &[usize],
        items: Option<usize>,
        (min, max): (usize, usize),
        unique: bool,
        depth: usize,
    ) -> Result<(), String> {
        if min > self.budget {
            return Err(format!(
                "an array of at least {min} items is larger than {} bytes",
                self.budget
            ));
        }
        let len = if depth >= SOFT_DEPTH {
            min
        } else {
            self.rng.between(min as u64, max.min(min + 2) as u64) as usize
        };
        self.out.push('[');
        let mut seen: Vec<String> = Vec::new();
        for i in 0..len {
            if i > 0 {
                self.out.push(',');
            }
            let node = match prefix.get(i).copied().or(items) {
                Some(node) => node,
                None => break,
            };
            self.item(node, unique.then_some(&mut seen), depth)?;
        }
        self.out.push(']');
        Ok(())
    }

    /// One array item; with `seen`, one that differs from those before.
    fn item(
        &mut self,
        node: usize,
        seen: Option<&mut Vec<String>>,
        depth: usize,
    ) -> Result<(), String> {
        let Some(seen) = seen else {
            return self.value(node, depth + 1);
        };
        let start = self.out.len();
        for _ in 0..16 {
            self.value(node, depth + 1)?;
            let item = self.out[start..].to_owned();
            if !seen.contains(&item) {
                seen.push(item);
                return Ok(());
            }
            self.out.truncate(start);
        }
        Err("cannot draw enough distinct items for `uniqueItems`".to_owned())
    }

    fn object(
        &mut self,
        props: &[Prop],
        extra: Option<usize>,
        (min, max): (usize, usize),
        depth: usize,
    ) -> Result<(), String> {
        let small = depth >= SOFT_DEPTH;
        let mut chosen: Vec<bool> = props
            .iter()
            .map(|p| p.required || (!small && self.rng.below(2) == 0))
            .collect();
        let mut count = chosen.iter().filter(|c| **c).count();
        for (take, prop) in chosen.iter_mut().zip(props) {
            if count > max && *take && !prop.required {
                *take = false;
                count -= 1;
            }
            if count < min && !*take {
                *take = true;
                count += 1;
            }
        }
        self.out.push('{');
        let mut written = 0;
        for (prop, _) in props.iter().zip(&chosen).filter(|(_, take)| **take) {
            self.property(&prop.name, prop.node, written, depth)?;
            written += 1;
        }
        if let Some(extra) = extra {
            // An open object with no listed properties (`json_object`)
            // gets a few of its own; any other gets what `min` asks for.
            let wanted = if props.is_empty() && !small {
                (min.max(1) + self.rng.below(3) as usize).min(max)
            } else {
                min
            };
            let start = self.rng.below(EXTRA_KEYS.len() as u64) as usize;
            let names = (0..)
                .map(|i| match EXTRA_KEYS.get(i) {
                    Some(_) => EXTRA_KEYS[(start + i) % EXTRA_KEYS.len()].to_owned(),
                    None => format!("extra_{i}"),
                })
                .filter(|name| props.iter().all(|p| &p.name != name));
            for name in names.take(wanted.saturating_sub(count)) {
                self.property(&name, extra, written, depth)?;
                written += 1;
            }
        }
        self.out.push('}');
        Ok(())
    }

    fn property(
        &mut self,
        name: &str,
        node: usize,
        written: usize,
        depth: usize,
    ) -> Result<(), String> {
        if written > 0 {
            self.out.push(',');
        }
        self.out
            .push_str(&serde_json::to_string(name).map_err(|e| e.to_string())?);
        self.out.push(':');
        self.value(node, depth + 1)
    }

    /// Which branch: any, or past the soft depth the first scalar one.
    fn branch(&mut self, branches: &[usize], small: bool) -> usize {
        let scalar = |&&b: &&usize| {
            !matches!(
                self.nodes[b],
                Node::Array { .. } | Node::Object { .. } | Node::OneOf(_) | Node::Any
            )
        };
        match branches.iter().find(scalar) {
            Some(&b) if small => b,
            _ => branches[self.rng.below(branches.len() as u64) as usize],
        }
    }
}
