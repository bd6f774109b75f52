//! The `iris` command: `iris serve` (the gateway), `iris demo` (every role
//! in one process on a generated tiny model), `iris preprocess`, `iris
//! tiny-model`; the command line itself is [`iris_cli::cli`].

#![forbid(unsafe_code)]

/// The gateway's allocator: mimalloc's per-thread pages cost a text
/// request about half the CPU glibc's arenas did (docs/benchmarks.md,
/// "Gateway CPU per text request"), and it returns freed memory to the
/// kernel on its own (after a second) like the setting below does for
/// glibc, which the C libraries linked in (libjpeg-turbo) still use.
///
/// Built with `no_thp`: mimalloc does not ask for transparent huge pages
/// on its own memory. Where the kernel gives them only on request (THP
/// `madvise`, the common setting), a huge page fault has to find 2 MiB of
/// free memory, and once the pixel cache's prepared memory has taken most
/// free blocks (8 GiB of them at `--mm-pixel-cache-mb 8192`) each one
/// compacts memory on the request's thread: 15 % of a fresh gateway's CPU
/// over its first images (docs/benchmarks.md, "Pixel cache cold start").
/// The tensors keep their huge pages: the vision crate asks for them
/// itself.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    iris_process::return_large_allocations();
    let code = iris_cli::main(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
