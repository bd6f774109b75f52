"""The ``iris`` console script: the whole ``iris`` command line (``iris
serve``, ``iris demo``, ...), as the Rust binary runs it."""

from __future__ import annotations

import signal
import sys

from . import _native


def main() -> None:
    """Runs ``iris`` with ``sys.argv`` and exits with its code."""
    # The CLI handles SIGINT/SIGTERM itself (iris serve: graceful stop);
    # Python's own handlers would only turn them into a late
    # KeyboardInterrupt once the command has returned.
    for name in ("SIGINT", "SIGTERM"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)
    sys.exit(_native.run_cli(["iris", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
