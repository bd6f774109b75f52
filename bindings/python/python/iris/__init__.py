"""Iris from Python: launch the Iris gateway (``iris serve``) inside this
process and stop it again.

:func:`launch_gateway` takes every ``iris serve`` option by keyword (or a
:class:`GatewayArgs`), starts the gateway on a background thread and returns
a :class:`Gateway` handle once it listens. Keywords become command-line
arguments parsed by the CLI's own parser (``foo_bar=1`` → ``--foo-bar=1``;
``True`` → the bare flag; ``None``/``False`` → omitted; a list → the option
repeated, a tuple inside it → one occurrence with several values), so a
bad option raises :class:`ValueError` with the CLI's message. See
docs/python.md.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from . import _native
from ._native import Gateway, GatewayError

__all__ = ["Gateway", "GatewayArgs", "GatewayError", "launch_gateway", "to_argv",
           "__version__"]
__version__: str = _native.__version__

_SEQUENCES = (list, tuple)


def _flag(keyword: str) -> str:
    if not isinstance(keyword, str) or not keyword:
        raise TypeError(f"option names are non-empty strings, not {keyword!r}")
    return "--" + keyword.replace("_", "-")


def _text(keyword: str, value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise TypeError(f"{keyword}: expected a string, a number or a path, "
                    f"not {type(value).__name__}")


def to_argv(options: Mapping[str, Any]) -> list[str]:
    """The ``iris serve`` arguments for keyword ``options`` (see the module
    docs for the rules)."""
    argv: list[str] = []
    for keyword, value in options.items():
        flag = _flag(keyword)
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, _SEQUENCES):
            for item in value:
                if isinstance(item, _SEQUENCES):
                    argv += [flag, *(_text(keyword, v) for v in item)]
                else:
                    argv.append(f"{flag}={_text(keyword, item)}")
        else:
            argv.append(f"{flag}={_text(keyword, value)}")
    return argv


class GatewayArgs:
    """``iris serve``'s options by keyword, checked by the CLI's parser on
    construction (:class:`ValueError` with its message when wrong).

    ``GatewayArgs(model_path="/m", epd_disaggregation=True, ...)``; options
    left out take their CLI default or their ``IRIS_…`` environment twin.
    """

    __slots__ = ("_options",)

    def __init__(self, **options: Any) -> None:
        self._options = dict(options)
        _native.check_args(self.argv())

    @property
    def options(self) -> dict[str, Any]:
        """The keywords given (a copy)."""
        return dict(self._options)

    def argv(self) -> list[str]:
        """The ``iris serve`` arguments (after ``iris serve``)."""
        return to_argv(self._options)

    def replace(self, **changes: Any) -> "GatewayArgs":
        """A copy with some options changed (``None`` drops one)."""
        return GatewayArgs(**{**self._options, **changes})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GatewayArgs) and other._options == self._options

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._options.items())
        return f"GatewayArgs({inner})"


def launch_gateway(args: GatewayArgs | None = None, /, **options: Any) -> Gateway:
    """Starts the gateway in this process and returns its handle once it
    listens. Options come from ``args`` and/or keywords (keywords win).

    Raises :class:`ValueError` (the CLI's message) for a bad option and
    :class:`GatewayError` when the gateway cannot start (unreadable model
    directory, missing workers for the mode, port in use, ...).
    """
    merged = {**(args.options if args is not None else {}), **options}
    return _native.launch(to_argv(merged))
