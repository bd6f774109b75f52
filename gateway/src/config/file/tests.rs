//! Unit tests of the configuration file: what it configures, and that
//! every refusal names the file, the line and the key.

use std::io::Write;

use super::super::{Config, Topology};

/// `text` written to a temporary `iris.toml`.
fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

/// `iris serve --config FILE FLAGS…` over `text`.
fn load(text: &str, flags: &[&str]) -> (tempfile::NamedTempFile, Result<Config, String>) {
    let f = file(text);
    let path = f.path().display().to_string();
    let argv: Vec<&str> = ["iris", "--config", path.as_str()]
        .into_iter()
        .chain(flags.iter().copied())
        .collect();
    let refs: Vec<&&str> = argv.iter().collect();
    let config = Config::from_argv(refs).map_err(|e| e.to_string());
    (f, config)
}

/// The error of `text` with `flags`, checked to start with `FILE:LINE:`.
fn refused(text: &str, flags: &[&str], line: usize) -> String {
    let (f, config) = load(text, flags);
    let error = config.expect_err("refused");
    let at = format!("{}:{line}: ", f.path().display());
    assert!(error.starts_with(&at), "{error}\n(expected it at {at})");
    error[at.len()..].to_owned()
}

const TWO: &str = r#"
request_timeout_secs = 42
mm_per_request_image_limit = 3

[[models]]
id = "alpha"
aliases = ["a", "first"]
model_path = "/models/alpha"
worker_urls = ["grpc://a1:1", "grpc://a2:1"]
policy = "round_robin"

[[models]]
id = "beta"
model_path = "/models/beta"
pd_disaggregation = true
prefill = [["grpc://p:1", 8998]]
decode = ["grpc://d:1"]
mm_per_request_image_limit = 7
context_length = 2048
"#;

#[test]
fn a_file_describes_each_model_and_the_gateway() {
    let (_f, config) = load(TWO, &["--port", "0"]);
    let config = config.unwrap();
    assert_eq!(config.request_timeout.as_secs(), 42);
    assert_eq!(config.listen.port, 0);
    let [alpha, beta] = &config.models[..] else {
        panic!("two models: {:?}", config.models.len());
    };
    assert_eq!(alpha.model.served_name.as_deref(), Some("alpha"));
    assert_eq!(alpha.model.aliases, ["a", "first"]);
    assert_eq!(alpha.model.path.to_str(), Some("/models/alpha"));
    assert!(alpha.model.hidden_alias.is_none());
    assert!(matches!(
        &alpha.topology,
        Topology::Aggregated { workers, policy } if workers.len() == 2 && policy.as_str() == "round_robin"
    ));
    // The top-level media limit is every model's default.
    assert_eq!(alpha.media.per_request_image_limit, 3);
    assert_eq!(beta.media.per_request_image_limit, 7);
    assert_eq!(beta.model.context_length, Some(2048));
    let Topology::Disaggregated {
        prefill, decode, ..
    } = &beta.topology
    else {
        panic!("beta is PD: {:?}", beta.topology);
    };
    assert_eq!((prefill.len(), decode.len()), (1, 1));
    assert_eq!(prefill[0].bootstrap_port, Some(8998));
    // Reloads compare what each model was built from.
    let source = beta.source.as_ref().unwrap();
    assert_eq!(source["mm_per_request_image_limit"].as_integer(), Some(7));
    assert_eq!(source["request_timeout_secs"].as_integer(), Some(42));
}

#[test]
fn syntax_errors_name_the_line() {
    let message = refused("port = 1\n[[models]\nid = \"x\"\n", &[], 2);
    assert!(!message.is_empty());
}

#[test]
fn unknown_and_misplaced_keys_are_refused() {
    let model = "[[models]]\nid = \"x\"\nmodel_path = \"/m\"\nworker_urls = [\"grpc://w:1\"]\n";
    let message = refused(&format!("{model}colour = \"blue\"\n"), &[], 5);
    assert!(
        message.starts_with("key `models[0].colour`: unknown key"),
        "{message}"
    );
    let message = refused(&format!("policy = \"random\"\n{model}"), &[], 1);
    assert!(
        message.starts_with("key `policy`: describes a model"),
        "{message}"
    );
    let message = refused(&format!("{model}max_retries = 2\n"), &[], 5);
    assert!(message.contains("is gateway-wide"), "{message}");
    let message = refused(&format!("{model}served_model_name = \"y\"\n"), &[], 5);
    assert!(message.contains("its `id`"), "{message}");
    let message = refused(&format!("config = \"other.toml\"\n{model}"), &[], 1);
    assert!(message.contains("command-line option only"), "{message}");
}

#[test]
fn bad_values_name_their_key() {
    let model = "[[models]]\nid = \"x\"\nmodel_path = \"/m\"\nworker_urls = [\"grpc://w:1\"]\n";
    let message = refused(&format!("port = \"eighty\"\n{model}"), &[], 1);
    assert!(
        message.starts_with("key `port`: invalid value 'eighty'"),
        "{message}"
    );
    let message = refused(&format!("{model}policy = \"fastest\"\n"), &[], 5);
    assert!(message.starts_with("key `models[0].policy`"), "{message}");
    let message = refused(
        &format!("{model}context_length = {{ tokens = 3 }}\n"),
        &[],
        5,
    );
    assert!(message.contains("not a table"), "{message}");
    let message = refused(
        "[[models]]\nid = \"x\"\nmodel_path = \"/m\"\nworker_urls = [\"ftp://w\"]\n",
        &[],
        2,
    );
    assert!(
        message.starts_with("key `models[0] (\"x\")`: `worker_urls`"),
        "{message}"
    );
}

#[test]
fn a_model_needs_an_id_a_directory_and_workers() {
    let message = refused("[[models]]\nmodel_path = \"/m\"\n", &[], 1);
    assert!(message.contains("needs an `id`"), "{message}");
    let message = refused(
        "[[models]]\nid = \"x\"\nworker_urls = [\"grpc://w:1\"]\n",
        &[],
        2,
    );
    assert!(message.contains("needs `model_path`"), "{message}");
    // The flags' checks, speaking of keys.
    let message = refused(
        "\n[[models]]\nid = \"x\"\nmodel_path = \"/m\"\npd_disaggregation = true\nprefill = [\"grpc://p:1\"]\n",
        &[],
        3,
    );
    assert!(
        message.contains("`pd_disaggregation` needs at least one `decode` URL"),
        "{message}"
    );
    let (f, config) = load("port = 1\n", &[]);
    let error = config.unwrap_err();
    assert!(
        error.starts_with(&format!("{}: no model", f.path().display())),
        "{error}"
    );
}

#[test]
fn two_models_may_not_share_a_name() {
    let text = r#"
[[models]]
id = "x"
model_path = "/m"
worker_urls = ["grpc://w:1"]

[[models]]
id = "y"
aliases = ["z", "x"]
model_path = "/n"
worker_urls = ["grpc://w:2"]
"#;
    let message = refused(text, &[], 9);
    assert_eq!(message, "key `aliases`: \"x\" already names model \"x\"");
}

#[test]
fn a_flag_and_the_file_may_not_set_the_same_thing() {
    let model = "[[models]]\nid = \"x\"\nmodel_path = \"/m\"\nworker_urls = [\"grpc://w:1\"]\n";
    let text = format!("request_timeout_secs = 5\n{model}");
    let message = refused(&text, &["--request-timeout-secs", "9"], 1);
    assert!(
        message.starts_with("key `request_timeout_secs`: also given as --request-timeout-secs"),
        "{message}"
    );
    // A media limit in a model table conflicts too.
    let text = format!("{model}mm_max_image_pixels = 100\n");
    let message = refused(&text, &["--mm-max-image-pixels", "5"], 5);
    assert!(
        message.contains("also given as --mm-max-image-pixels"),
        "{message}"
    );
    // A flag the file leaves alone applies.
    let (_f, config) = load(&text, &["--request-timeout-secs", "9"]);
    assert_eq!(config.unwrap().request_timeout.as_secs(), 9);
    // The per-model flags belong in the file.
    let (_f, config) = load(model, &["--model-path", "/other", "--policy", "random"]);
    let error = config.unwrap_err();
    assert!(
        error.starts_with("--model-path, --policy describe a model, but with --config"),
        "{error}"
    );
}

#[test]
fn without_a_file_the_flags_need_a_model_directory() {
    let error = Config::from_argv(&["iris", "--worker-urls", "grpc://w:1"]).unwrap_err();
    let error = error.to_string();
    assert!(
        error.contains("required arguments were not provided"),
        "{error}"
    );
    assert!(error.contains("--model-path"), "{error}");
    // The flags' one model answers to its directory too (unlisted).
    let config = Config::from_flags(&["--worker-urls", "grpc://w:1"]).unwrap();
    assert_eq!(config.first().model.hidden_alias.as_deref(), Some("/m"));
    assert!(config.first().model.aliases.is_empty() && config.file.is_none());
}

#[test]
fn keys_are_spoken_of_in_place_of_flags() {
    assert_eq!(
        super::as_keys("--prefill needs --pd-disaggregation (and -- x)"),
        "`prefill` needs `pd_disaggregation` (and -- x)"
    );
}

/// The Kubernetes overlay `two-models` ships a configuration file: it
/// loads (its token paths pointed at files that exist), with both models
/// found by discovery and told apart by the model label.
#[test]
fn the_two_models_overlay_file_loads() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/k8s/overlays/two-models/iris.toml"
    );
    let shipped = std::fs::read_to_string(path).unwrap();
    let token = file("a-token-for-the-test\n");
    let token = token.path().display().to_string();
    let text = shipped
        .replace("/etc/iris/admin/token", &token)
        .replace("/etc/iris/auth/token", &token);
    assert_ne!(text, shipped, "the overlay's file names its token files");
    let (_f, config) = load(&text, &[]);
    let config = config.unwrap();
    assert!(config.admin_token.is_some());
    let ids: Vec<&str> = config
        .models
        .iter()
        .map(|m| m.model.served_name.as_deref().unwrap_or_default())
        .collect();
    assert_eq!(ids, ["qwen-tiny", "gemma-tiny"]);
    for spec in &config.models {
        let discovery = spec.discovery.as_ref().expect("discovery");
        assert_eq!(discovery.model_label.as_deref(), Some("iris.ai/model"));
        assert_eq!(discovery.roles.len(), 1, "aggregated workers only");
    }
}

const ADAPTERS: &str = r#"
[[models]]
id = "alpha"
model_path = "/models/alpha"
worker_urls = ["grpc://a1:1"]
max_loras_per_worker = 2

[[models.adapters]]
name = "sql"
path = "/adapters/sql"

[[models.adapters]]
name = "chat"
path = "/adapters/chat"

[[models]]
id = "beta"
model_path = "/models/beta"
worker_urls = ["grpc://b:1"]
"#;

#[test]
fn a_model_lists_its_adapters_and_their_limit() {
    let (_f, config) = load(ADAPTERS, &[]);
    let config = config.unwrap();
    let alpha = &config.models[0].model;
    let names: Vec<(&str, &str)> = alpha
        .adapters
        .iter()
        .map(|a| (a.name.as_str(), a.path.as_str()))
        .collect();
    assert_eq!(
        names,
        [("sql", "/adapters/sql"), ("chat", "/adapters/chat")]
    );
    assert_eq!(alpha.max_loras_per_worker, 2);
    let beta = &config.models[1].model;
    assert!(beta.adapters.is_empty());
    assert_eq!(beta.max_loras_per_worker, 8, "the flag's default");
}

#[test]
fn bad_adapter_tables_name_their_line_and_key() {
    let twice = ADAPTERS.replace("name = \"chat\"", "name = \"sql\"");
    let error = refused(&twice, &[], 13);
    assert!(
        error.starts_with("key `models[0].adapters[1].name`: adapter \"sql\" is listed twice"),
        "{error}"
    );
    let colon = ADAPTERS.replace("name = \"chat\"", "name = \"a:b\"");
    let error = refused(&colon, &[], 13);
    assert!(error.contains("must not contain `:`"), "{error}");
    let unknown = ADAPTERS.replace("path = \"/adapters/chat\"", "dir = \"/adapters/chat\"");
    let error = refused(&unknown, &[], 14);
    assert!(
        error.starts_with("key `models[0].adapters[1].dir`: unknown key"),
        "{error}"
    );
    let empty = ADAPTERS.replace("path = \"/adapters/sql\"", "path = \"\"");
    let error = refused(&empty, &[], 10);
    assert!(
        error.starts_with("key `models[0].adapters[0].path`: must be a non-empty string"),
        "{error}"
    );
    let zero = ADAPTERS.replace("max_loras_per_worker = 2", "max_loras_per_worker = 0");
    let error = refused(&zero, &[], 6);
    assert!(
        error.starts_with("key `models[0].max_loras_per_worker`"),
        "{error}"
    );
}

#[test]
fn tls_files_are_gateway_wide_keys() {
    let ca = iris_testkit::tls::Ca::new("file");
    let (cert, key) = ca.write_pair("gateway", &ca.server());
    let model = "[[models]]\nid = \"m\"\nmodel_path = \"/m\"\nworker_urls = [\"grpcs://w:1\", \"grpc://v:1\"]\n";
    let text = format!(
        "tls_cert_file = {cert:?}\ntls_key_file = {key:?}\nworker_tls_ca_file = {:?}\n\n{model}",
        ca.ca_file()
    );
    let (_f, config) = load(&text, &[]);
    let config = config.expect("loads");
    assert!(config.listen.tls.is_some());
    assert!(config.connect.tls.is_some());
    let Topology::Aggregated { workers, .. } = &config.models[0].topology else {
        panic!("aggregated");
    };
    let tls: Vec<bool> = workers.iter().map(|w| w.tls).collect();
    assert_eq!(tls, [true, false]);
    // One of the pair alone names the other; in a model table it is refused.
    let alone = format!("tls_cert_file = {cert:?}\n\n{model}");
    let (_f, config) = load(&alone, &[]);
    let error = config.expect_err("refused");
    assert!(
        error.contains("--tls-cert-file needs --tls-key-file"),
        "{error}"
    );
    let misplaced = format!("{model}tls_key_file = {key:?}\n");
    let error = refused(&misplaced, &[], 5);
    assert!(error.contains("gateway-wide"), "{error}");
}
