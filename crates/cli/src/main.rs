//! The `iris` command: `iris serve` (the gateway), `iris demo` (every role
//! in one process on a generated tiny model), `iris preprocess`, `iris
//! tiny-model`; the command line itself is [`iris_cli::cli`].

#![forbid(unsafe_code)]

/// The gateway's allocator: mimalloc's per-thread pages cost a text
/// request about half the CPU glibc's arenas did (docs/benchmarks.md,
/// "Gateway CPU per text request"), and it returns freed memory to the
/// kernel on its own (after a second) like the setting below does for
/// glibc, which the C libraries linked in (libjpeg-turbo) still use.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    iris_process::return_large_allocations();
    let code = iris_cli::main(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
