"""The gateway's CPU per text request by stage, from a perf profile.

Reads `perf report --children --sort symbol -g none --stdio` on stdin
(a call-graph profile of the gateway under load, see text_cpu.sh) and the
measured CPU per request (µs) as the argument; prints a Markdown table of
each stage's inclusive share of the samples and its µs per request. A
stage is the largest inclusive share among the symbols its pattern
matches (the frame that encloses the stage's work).
"""

import re
import sys

STAGES = [
    ("HTTP/1 server: read and parse the request head", r"Conn<I,B,T>::poll_read_head"),
    ("HTTP/1 server: write the response (with the kernel's loopback send)",
     r"Buffered<T,B>::poll_flush"),
    ("JSON request parse and checks", r"Chat as iris_gateway::http::serve::Endpoint>::convert"),
    ("chat template render", r"Prompter::render_with"),
    ("tokenize", r"Prompter::encode"),
    ("router: plan, legs, the gRPC call started", r"Router>::start_with"),
    ("gRPC connection task (h2 frames both ways, the kernel's send to the worker)",
     r"(H2ClientFuture<B,T,E> as core::future|h2::client::Connection<T,B> as core::future)"),
    ("gRPC response decode", r"Streaming<T> as futures_core::stream::Stream>::poll_next"),
    ("detokenize and answer shaping", r"ChoiceText::(complete|push_text)"),
    ("request log line and metrics", r"Ledger::record::\{\{closure\}\}"),
    ("event loop waits (epoll)", r"\] epoll_wait"),
    ("futex (cross-thread wake-ups, the h2 stream lock)", r"\[k\] __x64_sys_futex"),
    ("allocator (glibc _int_malloc or mimalloc's page malloc, self)",
     r"\] (_int_malloc|_mi_page_malloc_zero)"),
    ("memmove (futures and buffers moved, self)", r"\] __memmove_\w+"),
]


def share(rows: list, pattern: str) -> float:
    """The largest inclusive share (%) among rows matching `pattern`."""
    best = 0.0
    for row in rows:
        if re.search(pattern, row):
            best = max(best, float(re.match(r"\s*([\d.]+)%", row).group(1)))
    return best


def main() -> None:
    cpu_us = float(sys.argv[1])
    rows = [row for row in sys.stdin if re.match(r"\s*[\d.]+%", row)]
    print("| stage | share of gateway CPU | µs per request |")
    print("|---|---:|---:|")
    for name, pattern in STAGES:
        pct = share(rows, pattern)
        print(f"| {name} | {pct:.1f} % | {pct * cpu_us / 100:.1f} |")


if __name__ == "__main__":
    main()
