//! docs/configuration.md against the command lines themselves: every flag
//! of `iris-engine`, `iris-encoder` and each `iris` subcommand, read from
//! their clap definitions (`CommandFactory`, the same data `--help` prints),
//! must have exactly one row in the doc with the same env var and default,
//! and every row must name a flag that exists.
//!
//! How the doc is read (also stated in the doc's introduction):
//! - A section is a `## ` heading that is one backticked command name
//!   (`## \`iris serve\``); its tables are every `| flag | env | default |
//!   meaning |` table up to the next `## ` heading (`### ` subsections
//!   included). Other tables are ignored.
//! - flag cell: the first word of its first backticked span, `--name`
//!   (a value name may follow: `` `--model-path DIR` ``). One flag a row.
//! - env cell: `—` when the flag has no env twin, else the first backticked
//!   span is the variable; `(comma-separated)` must follow it exactly when
//!   the flag splits its values on commas (clap's `value_delimiter`).
//! - default cell: backticks are dropped and its first word (up to a space,
//!   without a trailing `:`, `,` or `;`) must be clap's default as `--help`
//!   shows it (`[default: X]`, several values joined by `,`); without a
//!   clap default it must be `off` for a switch, `required` for a required
//!   flag and `unset` for any other flag. Prose may follow the first word.
//!
//! Positional arguments and clap's own `--help` / `--version` are not
//! checked. Every problem is collected and reported at once.

use std::collections::BTreeMap;

use clap::{Arg, ArgAction, Command, CommandFactory};

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");

/// One row of a flag table.
#[derive(Debug)]
struct Row {
    line: usize,
    flag: String,
    env: Option<String>,
    comma_separated: bool,
    default: String,
}

/// The command lines the doc describes, by section name.
fn commands() -> Vec<(String, Command)> {
    let mut out = vec![
        ("iris-engine".to_owned(), iris_engine::Cli::command()),
        ("iris-encoder".to_owned(), iris_encoder::Cli::command()),
    ];
    let iris = iris_cli::Cli::command();
    for sub in iris.get_subcommands().filter(|s| s.get_name() != "help") {
        out.push((format!("iris {}", sub.get_name()), sub.clone()));
    }
    out
}

/// The text of the first `` `…` `` span of `cell`, if any.
fn first_code_span(cell: &str) -> Option<&str> {
    let start = cell.find('`')? + 1;
    let len = cell[start..].find('`')?;
    Some(&cell[start..start + len])
}

/// The cells of a table line (`| a | b |` → `["a", "b"]`), trimmed.
fn cells(line: &str) -> Vec<&str> {
    let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
    inner.split('|').map(str::trim).collect()
}

/// The section name of a `## ` heading that is one backticked command.
fn section_name(line: &str) -> Option<String> {
    let title = line.strip_prefix("## ")?.trim();
    let name = title.strip_prefix('`')?.strip_suffix('`')?;
    (!name.contains('`')).then(|| name.to_owned())
}

/// A flag table row, or a description of what is wrong with it.
fn parse_row(line: usize, cols: &[&str]) -> Result<Row, String> {
    let [flag_cell, env_cell, default_cell, ..] = cols else {
        return Err(format!("line {line}: a flag row needs 4 cells"));
    };
    let flag = first_code_span(flag_cell)
        .and_then(|span| span.split_whitespace().next())
        .and_then(|word| word.strip_prefix("--"))
        .ok_or_else(|| format!("line {line}: flag cell {flag_cell:?} names no `--flag`"))?;
    let env = match *env_cell {
        "—" => None,
        cell => Some(
            first_code_span(cell)
                .ok_or_else(|| format!("line {line}: env cell {cell:?} is neither `VAR` nor —"))?
                .to_owned(),
        ),
    };
    Ok(Row {
        line,
        flag: flag.to_owned(),
        env,
        comma_separated: env_cell.contains("(comma-separated)"),
        default: default_word(default_cell),
    })
}

/// The first word of a default cell, backticks dropped.
fn default_word(cell: &str) -> String {
    let plain = cell.replace('`', "");
    let word = plain.split_whitespace().next().unwrap_or("");
    word.trim_end_matches([':', ',', ';']).to_owned()
}

/// The doc's flag rows by section, and the problems met while reading it.
fn parse_doc(doc: &str) -> (BTreeMap<String, Vec<Row>>, Vec<String>) {
    let mut sections: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut section: Option<String> = None;
    let mut in_table = false;
    for (index, line) in doc.lines().enumerate() {
        let number = index + 1;
        if line.starts_with("## ") {
            section = section_name(line);
            in_table = false;
            continue;
        }
        if !line.trim_start().starts_with('|') {
            in_table = false;
            continue;
        }
        let cols = cells(line);
        if cols == ["flag", "env", "default", "meaning"] {
            match &section {
                Some(name) => {
                    sections.entry(name.clone()).or_default();
                    in_table = true;
                }
                None => problems.push(format!(
                    "line {number}: flag table outside a `## \\`command\\`` section"
                )),
            }
            continue;
        }
        if !in_table || cols.iter().all(|c| c.chars().all(|ch| "-: ".contains(ch))) {
            continue;
        }
        let Some(name) = &section else { continue };
        match parse_row(number, &cols) {
            Ok(row) => sections.entry(name.clone()).or_default().push(row),
            Err(problem) => problems.push(problem),
        }
    }
    (sections, problems)
}

/// What the default cell must start with for `arg`.
fn expected_default(arg: &Arg) -> String {
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        return "off".to_owned();
    }
    if arg.is_required_set() {
        return "required".to_owned();
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if defaults.is_empty() {
        "unset".to_owned()
    } else {
        defaults.join(",")
    }
}

/// The flags of `cmd` the doc must describe.
fn documented_flags(cmd: &Command) -> Vec<&Arg> {
    cmd.get_arguments()
        .filter(|a| a.get_long().is_some() && !a.is_hide_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect()
}

/// The mismatches between one flag and its row.
fn compare(section: &str, arg: &Arg, row: &Row, problems: &mut Vec<String>) {
    let flag = arg.get_long().unwrap_or_default();
    let at = format!("`{section}` --{flag} (line {})", row.line);
    let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
    if row.env != env {
        let show = |e: &Option<String>| e.clone().unwrap_or_else(|| "—".to_owned());
        problems.push(format!(
            "{at}: env is {} in the code, {} in the doc",
            show(&env),
            show(&row.env)
        ));
    }
    let splits = env.is_some() && arg.get_value_delimiter() == Some(',');
    if row.comma_separated != splits {
        problems.push(format!(
            "{at}: the env value is {}comma-separated in the code; the doc {}",
            if splits { "" } else { "not " },
            if row.comma_separated {
                "says it is"
            } else {
                "must say `(comma-separated)`"
            }
        ));
    }
    let default = expected_default(arg);
    if row.default != default {
        problems.push(format!(
            "{at}: default cell must start with {default:?}, found {:?}",
            row.default
        ));
    }
}

/// Every mismatch between `doc` and `commands`.
fn check(doc: &str, commands: &[(String, Command)]) -> Vec<String> {
    let (sections, mut problems) = parse_doc(doc);
    for (name, cmd) in commands {
        let flags = documented_flags(cmd);
        let Some(rows) = sections.get(name) else {
            if !flags.is_empty() {
                problems.push(format!(
                    "`{name}`: no `## \\`{name}\\`` section with a flag table"
                ));
            }
            continue;
        };
        for arg in &flags {
            let long = arg.get_long().unwrap_or_default();
            let matching: Vec<&Row> = rows.iter().filter(|r| r.flag == long).collect();
            match matching.as_slice() {
                [] => problems.push(format!("`{name}` --{long}: no row in the doc")),
                [row] => compare(name, arg, row, &mut problems),
                more => problems.push(format!(
                    "`{name}` --{long}: {} rows (lines {:?})",
                    more.len(),
                    more.iter().map(|r| r.line).collect::<Vec<_>>()
                )),
            }
        }
        for row in rows {
            if !flags
                .iter()
                .any(|a| a.get_long() == Some(row.flag.as_str()))
            {
                problems.push(format!(
                    "`{name}` line {}: --{} is not a flag of this command",
                    row.line, row.flag
                ));
            }
        }
    }
    for name in sections.keys() {
        if !commands.iter().any(|(known, _)| known == name) {
            problems.push(format!("section `{name}` names no known command"));
        }
    }
    problems
}

#[test]
fn configuration_md_matches_every_command_line() {
    let doc = std::fs::read_to_string(DOC).unwrap_or_else(|e| panic!("reading {DOC}: {e}"));
    let problems = check(&doc, &commands());
    assert!(
        problems.is_empty(),
        "docs/configuration.md disagrees with the command lines ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// clap's own consistency checks on the three command lines (what
/// `--help` and parsing would otherwise find only at run time).
#[test]
fn command_lines_are_consistent() {
    iris_engine::Cli::command().debug_assert();
    iris_encoder::Cli::command().debug_assert();
    iris_cli::Cli::command().debug_assert();
}

/// The checker itself: each kind of mismatch is reported, all at once.
#[test]
fn checker_reports_every_kind_of_mismatch() {
    let cmd = Command::new("tool")
        .arg(
            Arg::new("port")
                .long("port")
                .env("T_PORT")
                .default_value("80"),
        )
        .arg(
            Arg::new("on")
                .long("on")
                .env("T_ON")
                .action(ArgAction::SetTrue),
        )
        .arg(Arg::new("path").long("path").required(true))
        .arg(Arg::new("name").long("name").env("T_NAME"))
        .arg(
            Arg::new("list")
                .long("list")
                .env("T_LIST")
                .value_delimiter(','),
        )
        .arg(Arg::new("lost").long("lost"));
    let doc = "\
## `tool`

| flag | env | default | meaning |
|---|---|---|---|
| `--port N` | `T_PORT` | 8080 | wrong default |
| `--on` | `T_OTHER` | off | wrong env |
| `--path` | — | required | fine |
| `--name` | `T_NAME` | the tool's name | must say unset |
| `--list` | `T_LIST` | unset | not said to be comma-separated |
| `--gone` | `T_GONE` | 1 | stale |

## `other`

| flag | env | default | meaning |
|---|---|---|---|
| `--x` | — | unset | unknown section |
";
    let problems = check(doc, &[("tool".to_owned(), cmd)]);
    let expect = [
        "--port (line 5): default cell must start with \"80\"",
        "--on (line 6): env is T_ON in the code, T_OTHER",
        "--name (line 8): default cell must start with \"unset\", found \"the\"",
        "--list (line 9): the env value is comma-separated",
        "--lost: no row",
        "line 10: --gone is not a flag",
        "section `other` names no known command",
    ];
    for e in expect {
        assert!(
            problems.iter().any(|p| p.contains(e)),
            "{e:?} not in {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expect.len(), "{problems:#?}");
}
