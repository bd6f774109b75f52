//! The configuration file of `iris serve --config FILE` (TOML,
//! docs/configuration.md): top-level keys are gateway-wide settings, each
//! `[[models]]` table one served model. Every key is the `iris serve` flag
//! of the same name (`--request-timeout-secs` is `request_timeout_secs`),
//! so a key means, defaults and is checked exactly as its flag: the file's
//! values are parsed by the flags' own clap definitions and laid over the
//! command line's. A model table also takes `id` (the name clients use,
//! required) and `aliases`.
//!
//! Every error names the file, the line and the key. A key set by the
//! file and by its flag (or `IRIS_…` variable) is refused, naming both;
//! so are the per-model flags (`--model-path`, the workers, …) beside a
//! file, whose models are its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};

use clap::builder::Resettable;
use clap::parser::ValueSource;
use clap::{ArgMatches, FromArgMatches};
use serde::Deserialize;
use toml::{Spanned, Value};

use super::{model_spec, AdapterConfig, ConfigError, ModelSpec};
use crate::args::ServeArgs;

/// The options that describe one model: a model table's keys, never
/// top-level ones nor flags beside a file.
const MODEL_KEYS: &[&str] = &[
    "model_path",
    "chat_template",
    "tool_call_parser",
    "reasoning_parser",
    "context_length",
    "tokenizer_cache_entries",
    "max_loras_per_worker",
    "worker_urls",
    "pd_disaggregation",
    "prefill",
    "decode",
    "epd_disaggregation",
    "encode",
    "encode_policy",
    "encode_load_factor",
    "policy",
    "prefill_policy",
    "decode_policy",
    "service_discovery",
    "selector",
    "encode_selector",
    "prefill_selector",
    "decode_selector",
    "service_discovery_namespace",
    "service_discovery_port",
    "lws_leaders_only",
];

/// Options no file sets: the file itself, logging (set up before the
/// file is read) and the served name (a model table's `id`).
const NOT_IN_FILE: &[&str] = &["config", "log_format", "log_json", "served_model_name"];

/// A model table's own keys besides its options.
const NAME_KEYS: &[&str] = &["id", "aliases", "adapters"];

/// The keys of a `[[models.adapters]]` table.
const ADAPTER_KEYS: &[&str] = &["name", "path"];

/// Where a key is allowed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// The top level: gateway-wide settings and media defaults.
    Top,
    /// A `[[models]]` table.
    Model,
}

impl Scope {
    /// Whether option `id` may be set here: media (`mm_*`) options in
    /// both, the per-model ones in a model table, the rest at the top.
    fn allows(self, id: &str) -> bool {
        if NOT_IN_FILE.contains(&id) {
            return false;
        }
        if is_media(id) {
            return true;
        }
        MODEL_KEYS.contains(&id) == (self == Scope::Model)
    }
}

/// The media options (a model's limits, defaulted at the top level).
fn is_media(id: &str) -> bool {
    id.starts_with("mm_") || id == "allowed_local_media_path"
}

/// A table's keys with where each value is.
type Table = BTreeMap<String, Spanned<Value>>;

/// The `[[models]]` tables alone (the rest is read as a [`Table`]).
#[derive(Deserialize)]
struct Models {
    #[serde(default)]
    models: Vec<Table>,
}

/// Each model's `[[models.adapters]]` tables, read apart so that their
/// values keep where they are.
#[derive(Deserialize)]
struct Adapters {
    #[serde(default)]
    models: Vec<ModelAdapters>,
}

#[derive(Deserialize)]
struct ModelAdapters {
    #[serde(default)]
    adapters: Vec<Table>,
}

/// What a configuration file was read from, for reloads.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: PathBuf,
    /// The command line it was laid over.
    pub args: ServeArgs,
    /// Its top-level settings as read (a reload applies only models).
    pub top: toml::Table,
}

/// A configuration file read and checked.
pub struct Loaded {
    /// The command line with the file's top-level settings laid over it.
    pub gateway: ServeArgs,
    pub models: Vec<ModelSpec>,
    pub source: Source,
}

/// Reads and checks the file at `path` over the command line `args`.
pub fn load(path: &Path, args: &ServeArgs) -> Result<Loaded, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(format!(
            "cannot read the configuration file {} (--config): {e}",
            path.display()
        ))
    })?;
    Doc { path, text: &text }.load(args)
}

/// Re-reads the file of `source` over the command line it started with:
/// the models it describes now and its top-level settings.
pub fn reload(source: &Source) -> Result<Loaded, ConfigError> {
    load(&source.path, &source.args)
}

/// A file's text and name, for errors that point into it.
struct Doc<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Doc<'_> {
    fn load(&self, args: &ServeArgs) -> Result<Loaded, ConfigError> {
        refuse_model_flags(args, self.path)?;
        let mut top: Table = toml::from_str(self.text).map_err(|e| self.syntax(&e))?;
        let models: Models = toml::from_str(self.text).map_err(|e| self.syntax(&e))?;
        let adapters: Adapters = toml::from_str(self.text).map_err(|e| self.syntax(&e))?;
        let models_span = top.remove("models").map(|v| v.span());
        if models.models.is_empty() {
            return Err(ConfigError::new(format!(
                "{}: no model: describe each served model in a [[models]] table (id, model_path, workers)",
                self.path.display()
            )));
        }
        let mut gateway = args.clone();
        self.overlay(&mut gateway, &top, Scope::Top, "")?;
        let mut names = Names::default();
        let mut specs = Vec::new();
        for (index, table) in models.models.iter().enumerate() {
            let at = table
                .get("id")
                .map(Spanned::span)
                .or_else(|| models_span.clone())
                .unwrap_or_default();
            let mut spec = self.model(&gateway, &top, table, index, at.clone())?;
            let tables = adapters.models.get(index).map_or(&[][..], |m| &m.adapters);
            spec.model.adapters = self.adapters(tables, &format!("models[{index}]."), at)?;
            names.claim(self, &spec, table)?;
            specs.push(spec);
        }
        Ok(Loaded {
            gateway,
            models: specs,
            source: Source {
                path: self.path.to_owned(),
                args: args.clone(),
                top: plain(&top),
            },
        })
    }

    /// Model `index` (its `id` at `at`), over the gateway's options.
    fn model(
        &self,
        gateway: &ServeArgs,
        top: &Table,
        table: &Table,
        index: usize,
        at: Range<usize>,
    ) -> Result<ModelSpec, ConfigError> {
        let scope = format!("models[{index}].");
        let id = self.string(table, "id", &scope)?.ok_or_else(|| {
            self.error(
                at.clone(),
                &format!("models[{index}]"),
                "a model needs an `id`, the name clients use",
            )
        })?;
        let aliases = self.strings(table, "aliases", &scope)?;
        let mut args = gateway.clone();
        self.overlay(&mut args, table, Scope::Model, &scope)?;
        let key = format!("models[{index}] (\"{id}\")");
        let path = args.model_path.clone().ok_or_else(|| {
            self.error(
                at.clone(),
                &key,
                "a model needs `model_path`, its model directory",
            )
        })?;
        let mut spec = model_spec(&args, path, aliases, None)
            .map_err(|e| self.error(at, &key, &as_keys(&e.0)))?;
        spec.model.served_name = Some(id);
        let mut source = plain(top);
        source.extend(plain(table));
        spec.source = Some(source);
        Ok(spec)
    }

    /// Lays the options of `table` (keys allowed in `scope`) over `args`;
    /// `prefix` names the table in errors.
    fn overlay(
        &self,
        args: &mut ServeArgs,
        table: &Table,
        scope: Scope,
        prefix: &str,
    ) -> Result<(), ConfigError> {
        let command = file_command();
        let mut argv = Vec::new();
        for (key, value) in table {
            if scope == Scope::Model && NAME_KEYS.contains(&key.as_str()) {
                continue;
            }
            let at = value.span();
            let name = format!("{prefix}{key}");
            let arg = command
                .get_arguments()
                .find(|a| a.get_id() == key.as_str() && scope.allows(key))
                .ok_or_else(|| self.error(at.clone(), &name, &unknown_key(key, scope)))?;
            if args.given.contains(key) {
                let flag = arg.get_long().unwrap_or(key.as_str());
                let message =
                    format!("also given as --{flag} (or its IRIS_ variable); set it in one place");
                return Err(self.error(at, &name, &message));
            }
            let mut one = flag_values(arg.get_long().unwrap_or(key.as_str()), value.get_ref())
                .map_err(|e| self.error(at.clone(), &name, &e))?;
            // Parsed alone first, so a bad value is blamed on its key.
            command
                .clone()
                .try_get_matches_from(&one)
                .map_err(|e| self.error(at, &name, &clap_message(&e)))?;
            argv.append(&mut one);
        }
        let whole = table.values().next().map(Spanned::span).unwrap_or_default();
        let matches = command
            .try_get_matches_from(&argv)
            .map_err(|e| self.error(whole, prefix.trim_end_matches('.'), &clap_message(&e)))?;
        apply(args, matches).map_err(|e| ConfigError::new(format!("{}: {e}", self.path.display())))
    }

    /// The `[[models.adapters]]` tables of model `index` (`tables`, with
    /// where each value is): each a `name` (no `:`, unique in the model)
    /// and a `path`.
    fn adapters(
        &self,
        tables: &[Table],
        prefix: &str,
        at: Range<usize>,
    ) -> Result<Vec<AdapterConfig>, ConfigError> {
        let mut adapters: Vec<AdapterConfig> = Vec::new();
        for (i, table) in tables.iter().enumerate() {
            let key = format!("{prefix}adapters[{i}]");
            let adapter = self.adapter(table, &key, at.clone())?;
            if adapters.iter().any(|a| a.name == adapter.name) {
                let span = table.get("name").map(Spanned::span).unwrap_or_default();
                let message = format!("adapter \"{}\" is listed twice", adapter.name);
                return Err(self.error(span, &format!("{key}.name"), &message));
            }
            adapters.push(adapter);
        }
        Ok(adapters)
    }

    /// One adapter table, named `key` in errors (`at`: its model's place,
    /// for a key it lacks).
    fn adapter(
        &self,
        table: &Table,
        key: &str,
        at: Range<usize>,
    ) -> Result<AdapterConfig, ConfigError> {
        if let Some((unknown, value)) = table
            .iter()
            .find(|(k, _)| !ADAPTER_KEYS.contains(&k.as_str()))
        {
            let message = "unknown key (an adapter has `name` and `path`)";
            return Err(self.error(value.span(), &format!("{key}.{unknown}"), message));
        }
        let field = |name: &str| {
            let span = table.get(name).map_or(at.clone(), Spanned::span);
            self.string(table, name, &format!("{key}."))?
                .ok_or_else(|| self.error(span, &format!("{key}.{name}"), "is required"))
        };
        let (name, path) = (field("name")?, field("path")?);
        if name.contains(':') || name.trim() != name {
            let span = table.get("name").map(Spanned::span).unwrap_or_default();
            let message =
                "must not contain `:` nor surrounding spaces (requests name it MODEL:NAME)";
            return Err(self.error(span, &format!("{key}.name"), message));
        }
        Ok(AdapterConfig { name, path })
    }

    /// The string at `key` of `table`, if set.
    fn string(
        &self,
        table: &Table,
        key: &str,
        prefix: &str,
    ) -> Result<Option<String>, ConfigError> {
        let Some(value) = table.get(key) else {
            return Ok(None);
        };
        match value.get_ref() {
            Value::String(s) if !s.trim().is_empty() => Ok(Some(s.clone())),
            _ => Err(self.error(
                value.span(),
                &format!("{prefix}{key}"),
                "must be a non-empty string",
            )),
        }
    }

    /// The strings at `key` of `table` (none when unset).
    fn strings(&self, table: &Table, key: &str, prefix: &str) -> Result<Vec<String>, ConfigError> {
        let Some(value) = table.get(key) else {
            return Ok(Vec::new());
        };
        let bad = || {
            self.error(
                value.span(),
                &format!("{prefix}{key}"),
                "must be an array of non-empty strings",
            )
        };
        let Value::Array(items) = value.get_ref() else {
            return Err(bad());
        };
        items
            .iter()
            .map(|item| match item {
                Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
                _ => Err(bad()),
            })
            .collect()
    }

    /// `FILE:LINE: key `KEY`: MESSAGE`.
    fn error(&self, at: Range<usize>, key: &str, message: &str) -> ConfigError {
        ConfigError::new(format!(
            "{}:{}: key `{key}`: {message}",
            self.path.display(),
            self.line(at.start)
        ))
    }

    /// A TOML syntax or shape error, with its line.
    fn syntax(&self, error: &toml::de::Error) -> ConfigError {
        let line = error.span().map(|s| self.line(s.start));
        let at = line.map(|l| format!(":{l}")).unwrap_or_default();
        ConfigError::new(format!(
            "{}{at}: {}",
            self.path.display(),
            error.message().trim_end()
        ))
    }

    /// The 1-based line of byte `offset`.
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }
}

/// Every name a model claims (id and aliases), so no two models share one.
#[derive(Default)]
struct Names(HashMap<String, String>);

impl Names {
    fn claim(&mut self, doc: &Doc<'_>, spec: &ModelSpec, table: &Table) -> Result<(), ConfigError> {
        let id = spec.model.served_name.clone().unwrap_or_default();
        for name in std::iter::once(&id).chain(&spec.model.aliases) {
            if let Some(owner) = self.0.insert(name.clone(), id.clone()) {
                let key = if *name == id { "id" } else { "aliases" };
                let at = table.get(key).map(Spanned::span).unwrap_or_default();
                let message = format!("\"{name}\" already names model \"{owner}\"");
                return Err(doc.error(at, key, &message));
            }
        }
        Ok(())
    }
}

/// Refuses per-model flags beside a configuration file.
fn refuse_model_flags(args: &ServeArgs, path: &Path) -> Result<(), ConfigError> {
    let given: BTreeSet<&str> = args.given.iter().map(String::as_str).collect();
    let model_flags: Vec<String> = MODEL_KEYS
        .iter()
        .chain(["served_model_name"].iter())
        .filter(|id| given.contains(*id))
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect();
    if model_flags.is_empty() {
        return Ok(());
    }
    let verb = if model_flags.len() == 1 {
        "describes"
    } else {
        "describe"
    };
    Err(ConfigError::new(format!(
        "{} {verb} a model, but with --config {} the models are its [[models]] tables: move them into the file",
        model_flags.join(", "),
        path.display()
    )))
}

/// `iris serve`'s options as the file sets them: no defaults, no
/// environment, nothing required, so only the file's keys are present.
fn file_command() -> clap::Command {
    let command = clap::Command::new("config")
        .no_binary_name(true)
        .disable_help_flag(true)
        .disable_version_flag(true);
    <ServeArgs as clap::Args>::augment_args(command).mut_args(|arg| {
        arg.default_value(Resettable::Reset)
            .env(Resettable::Reset)
            .required(false)
            .required_unless_present(Resettable::Reset)
    })
}

/// Lays the options `matches` holds over `args`.
fn apply(args: &mut ServeArgs, mut matches: ArgMatches) -> Result<(), clap::Error> {
    let implicit: Vec<String> = matches
        .ids()
        .filter(|id| matches.value_source(id.as_str()) != Some(ValueSource::CommandLine))
        .map(|id| id.as_str().to_owned())
        .collect();
    for id in implicit {
        // Only the ids the command defines are listed, so this succeeds.
        let _ = matches.try_clear_id(&id);
    }
    args.update_from_arg_matches(&matches)
}

/// The command-line words for `--flag` set to `value`: `true` is the bare
/// flag, an array one `--flag=ITEM` per item (nested arrays flattened, so
/// a worker's bootstrap port may follow its URL).
fn flag_values(flag: &str, value: &Value) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    push_values(flag, value, &mut words)?;
    Ok(words)
}

fn push_values(flag: &str, value: &Value, words: &mut Vec<String>) -> Result<(), String> {
    match value {
        Value::Boolean(true) => words.push(format!("--{flag}")),
        Value::Boolean(false) => {}
        Value::String(s) => words.push(format!("--{flag}={s}")),
        Value::Integer(n) => words.push(format!("--{flag}={n}")),
        Value::Float(x) => words.push(format!("--{flag}={x}")),
        Value::Array(items) => {
            for item in items {
                push_values(flag, item, words)?;
            }
        }
        Value::Table(_) | Value::Datetime(_) => {
            return Err(format!(
                "takes a {}, not a {}",
                "string, number, boolean or array",
                value.type_str()
            ))
        }
    }
    Ok(())
}

/// Why `key` is not accepted in `scope`.
fn unknown_key(key: &str, scope: Scope) -> String {
    if NOT_IN_FILE.contains(&key) {
        return match key {
            "served_model_name" => "a model's name is its `id`".to_owned(),
            _ => "is a command-line option only".to_owned(),
        };
    }
    match scope {
        Scope::Top if MODEL_KEYS.contains(&key) => {
            "describes a model: set it in a [[models]] table".to_owned()
        }
        Scope::Model if !MODEL_KEYS.contains(&key) && flag_exists(key) => {
            "is gateway-wide: set it at the top level of the file".to_owned()
        }
        _ => "unknown key (the keys are the `iris serve` flags, with `_` for `-`; docs/configuration.md)"
            .to_owned(),
    }
}

/// Whether `iris serve` has an option of id `key`.
fn flag_exists(key: &str) -> bool {
    file_command().get_arguments().any(|a| a.get_id() == key)
}

/// clap's message about one option, without its `error:` prefix and usage.
fn clap_message(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_owned()
}

/// `message` (about flags) speaking of the file's keys: `--foo-bar` is
/// `` `foo_bar` ``.
fn as_keys(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find("--") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let len = after
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .unwrap_or(after.len());
        if len == 0 {
            out.push_str("--");
        } else {
            out.push('`');
            out.push_str(&after[..len].replace('-', "_"));
            out.push('`');
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// `table` without its spans.
fn plain(table: &Table) -> toml::Table {
    table
        .iter()
        .map(|(k, v)| (k.clone(), v.get_ref().clone()))
        .collect()
}

#[cfg(test)]
mod tests;
