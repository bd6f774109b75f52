//! Command-line options every tensor receiver shares (`iris-encoder`,
//! `iris-engine`), defined once. Each binary flattens [`ShmNameArgs`] and
//! names the environment twin in its own prefix:
//! `#[command(mut_arg("shm_name_prefixes", |a| a.env("IRIS_…_SHM_NAME_PREFIX")))]`.

use crate::shm::ShmNames;

/// Which `/dev/shm` file names a receiver accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ShmNameArgs {
    /// Another sender's shm file-name prefix to accept, besides Iris's
    /// (`iris-tensor-`) and smg's (`smg-tokenspeed-`); repeatable, or
    /// comma-separated in the environment. Names with no accepted prefix
    /// are refused unopened.
    #[arg(long = "shm-name-prefix", value_name = "PREFIX", value_delimiter = ',')]
    pub shm_name_prefixes: Vec<String>,
}

impl ShmNameArgs {
    /// The default senders' prefixes and the `--shm-name-prefix` ones; an
    /// error names the flag.
    pub fn names(&self) -> Result<ShmNames, String> {
        self.shm_name_prefixes
            .iter()
            .try_fold(ShmNames::default(), |names, prefix| {
                names.with_prefix(prefix.trim())
            })
            .map_err(|e| format!("--shm-name-prefix: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    #[command(mut_arg("shm_name_prefixes", |a| a.env("TEST_ONLY_SHM_NAME_PREFIX_TWIN")))]
    struct Cli {
        #[command(flatten)]
        shm: ShmNameArgs,
    }

    #[test]
    fn prefixes_are_repeatable_checked_and_named_in_errors() {
        let cli =
            Cli::try_parse_from(["x", "--shm-name-prefix", "a-", "--shm-name-prefix", "b-,c-"])
                .unwrap();
        assert_eq!(cli.shm.shm_name_prefixes, ["a-", "b-", "c-"]);
        assert!(cli.shm.names().is_ok());
        let bad = ShmNameArgs {
            shm_name_prefixes: vec!["../x".into()],
        };
        assert!(bad.names().unwrap_err().starts_with("--shm-name-prefix: "));
        let env = Cli::command_for_test();
        assert_eq!(
            env.get_arguments()
                .find(|a| a.get_id() == "shm_name_prefixes")
                .and_then(|a| a.get_env())
                .and_then(|e| e.to_str()),
            Some("TEST_ONLY_SHM_NAME_PREFIX_TWIN")
        );
    }

    impl Cli {
        fn command_for_test() -> clap::Command {
            <Cli as clap::CommandFactory>::command()
        }
    }
}
