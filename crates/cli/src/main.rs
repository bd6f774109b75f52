//! The `iris` command: `iris serve` (the gateway), `iris demo` (every role
//! in one process on a generated tiny model), `iris preprocess`, `iris
//! tiny-model`; the command line itself is [`iris_cli::cli`].

#![forbid(unsafe_code)]

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    iris_process::return_large_allocations();
    let code = iris_cli::main(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
