//! Command-line options every tensor receiver shares (`iris-encoder`,
//! `iris-engine`), defined once. Each binary flattens [`ShmNameArgs`] and
//! [`NixlReceiverArgs`] and names the environment twins in its own prefix:
//! `#[command(mut_arg("shm_name_prefixes", |a| a.env("IRIS_…_SHM_NAME_PREFIX")))]`.

use std::path::PathBuf;
use std::time::Duration;

use crate::receiving::RemoteSettings;
use crate::shm::ShmNames;

/// How a worker receives RDMA payloads (feature `nixl`): its NIXL agent
/// and landing pool.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct NixlReceiverArgs {
    /// libnixl_capi.so to load before NIXL is used (else the dynamic
    /// linker's search path); a missing library disables the RDMA lane.
    #[arg(long)]
    pub nixl_lib: Option<PathBuf>,
    /// This worker's NIXL agent name (default: the binary's name and PID).
    #[arg(long)]
    pub nixl_agent_name: Option<String>,
    /// The gateway's NIXL agent name (its --nixl-agent-name; the default
    /// is the name an smg gateway registers).
    #[arg(long, default_value = crate::DEFAULT_SENDER_AGENT_NAME)]
    pub nixl_sender_name: String,
    /// Port of this worker's NIXL metadata listener (0: a free one).
    #[arg(long, default_value_t = 0)]
    pub rdma_listen_port: u16,
    /// Landing buffers for RDMA READs (concurrent READs; 0: no RDMA lane).
    #[arg(long, default_value_t = 4)]
    pub rdma_landing_slots: usize,
    /// MiB per landing buffer (at least the gateway's --rdma-slot-size-mb).
    #[arg(long, default_value_t = 32)]
    pub rdma_landing_slot_size_mb: usize,
    /// Longest wait for a free landing buffer, in ms.
    #[arg(long, default_value_t = 1000)]
    pub rdma_landing_wait_ms: u64,
    /// Longest wait for the gateway's metadata, then for a READ, in ms.
    /// The gateway's --rdma-receiver-hold-ms must be at least the landing
    /// wait plus four times this: the worker reports that hold in
    /// GetServerInfo, and a gateway whose hold is shorter sends it no rdma
    /// tensors.
    #[arg(long, default_value_t = 2000)]
    pub rdma_read_timeout_ms: u64,
}

impl NixlReceiverArgs {
    /// The validated settings; an error names the flag.
    pub fn settings(&self) -> Result<RemoteSettings, String> {
        let too_large = || {
            format!(
                "--rdma-landing-slot-size-mb {} is too large",
                self.rdma_landing_slot_size_mb
            )
        };
        let landing_slot_bytes = self
            .rdma_landing_slot_size_mb
            .checked_mul(1 << 20)
            .ok_or_else(too_large)?;
        Ok(RemoteSettings {
            nixl_lib: self.nixl_lib.clone(),
            agent_name: self.nixl_agent_name.clone(),
            sender_name: self.nixl_sender_name.clone(),
            listen_port: self.rdma_listen_port,
            landing_slots: self.rdma_landing_slots,
            landing_slot_bytes,
            landing_wait: Duration::from_millis(self.rdma_landing_wait_ms),
            read_timeout: Duration::from_millis(self.rdma_read_timeout_ms.max(1)),
        })
    }
}

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
