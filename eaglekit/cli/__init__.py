"""The `eaglekit` command: the parser built from the registry of subcommands (eaglekit.cli.registry), and main, which
runs one. Thin by design: the commands are plain functions in the modules imported below, by job (decode, doctor,
train, serve), with the options they share in eaglekit.cli.common; importing a module registers its commands."""

from __future__ import annotations

import argparse
import sys

from ..errors import EaglekitError

# importing a module registers its commands, in this order: the order `eaglekit --help` lists them in
from . import decode, doctor, serve, train  # noqa: F401
from .registry import COMMANDS, command

__all__ = ["COMMANDS", "build_parser", "command", "entry", "main", "resolve_target_arg"]


# --- entry point -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="eaglekit", description="EAGLE-3 speculative decoding toolkit")
    parser.add_argument("--version", action="version", version=f"eaglekit {__version__}")
    # what main and resolve_target_arg read of any command: its function (None: no command given), its --target (None
    # for a command without one) and the path that --target gave (resolve_target_arg; None until it runs)
    parser.set_defaults(func=None, target=None, target_source=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (fn, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=(fn.__doc__ or help_).strip())
        fn.add_args(p)
        p.set_defaults(func=fn)
    return parser


def resolve_target_arg(args) -> None:
    """--target FILE.gguf (or a folder holding one GGUF) becomes the folder eaglekit.gguf materializes from it, once,
    before any command reads it; `target_source` keeps the path as given (serve's default model name)."""
    given = args.target
    if isinstance(given, str):
        from ..gguf import resolve_target

        args.target = str(resolve_target(given))
        args.target_source = given


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.func:
        parser.print_help()
        return 2
    try:
        resolve_target_arg(args)
        # every command that runs a model takes --threads (ModelOptions' runtime group) and, without it, chooses from
        # the machine's load (options.apply_threads); serve and demo choose by their own rules
        if "threads" in vars(args) and args.command not in ("serve", "demo"):
            from ..options import apply_threads

            apply_threads(args.threads, args.device)
        if args.command in ("generate", "eval", "doctor", "serve"):
            from ..distributed import enter_cli, shutdown

            rc = enter_cli(args, argv)  # --tp N spawns N ranks; under torchrun: joins the group
            if rc is not None:
                return rc
            rc = int(args.func(args) or 0)
            shutdown()
            return rc
        return int(args.func(args) or 0)
    except EaglekitError as e:
        from ..distributed import error_stream, rank_tag

        print(f"eaglekit {args.command}{rank_tag()}: error {e}", file=error_stream())
        return 2
    except KeyboardInterrupt:
        print(f"eaglekit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception:
        from ..distributed import error_stream

        if error_stream() is not sys.stderr:  # a silenced tensor-parallel rank: its traceback must still show
            import traceback

            traceback.print_exc(file=error_stream())
        raise


def entry() -> None:
    """The process's entry (the `eaglekit` script, `python -m eaglekit`, `python -m eaglekit.cli`): main, then exit.
    A rank of a multi-process launch (torchrun, --tp N) ends with os._exit once its streams are flushed: by then its
    work is written and its process group left (distributed.leave_group), and the interpreter's finalization can still
    abort the process ("terminate called without an active exception", SIGABRT) as torch's C++ threads are torn down,
    which turns a finished run into a failed launch: 4 of 60 two-rank CPU training runs on a loaded 2-core machine,
    every one after main had returned on both ranks. No eaglekit code registers atexit work."""
    import os

    rc = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
