"""The registry of `eaglekit` subcommands: COMMANDS maps each name to its function and its one-line help, and
`command` adds a function to it. The command modules register through it; the dispatcher (eaglekit.cli) reads it."""

from __future__ import annotations

COMMANDS: dict[str, tuple] = {}


def command(name: str, help: str):
    """Register `fn(args) -> int` as a subcommand; `fn.add_args(parser)` declares its options."""

    def wrap(fn):
        COMMANDS[name] = (fn, help)
        return fn

    return wrap
