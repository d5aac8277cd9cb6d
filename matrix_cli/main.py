"""The ``grace-matrix`` command line: a thin shell over typed functions.

Problem: people and scripts drive the matrix from a terminal and from CI; both need the same commands,
machine-readable output for scripts, and failures that say what to fix in one line with an exit status
that a CI step can act on.

Design: each subcommand lives in ``matrix_cli/commands/<name>.py`` (listed in ``COMMAND_MODULES``) and only
parses arguments, calls a typed function and prints. Every subcommand parser is a ``CommandParser``,
which adds the common options (``--db``, ``--config``, ``--json``, ``-v``), so they work after the
subcommand name. ``main`` is the only place that prints errors.

Invariants: exit status 0 ok, 1 regression found or user error, 2 usage or configuration error, 3 an
internal error (a bug: the traceback is printed), so a script never takes a crash for a finding; a
``MatrixError``, a database error or an output that cannot be written (standard output on a full disk:
exit 2; a closed pipe: exit 0) never shows a traceback (``-v`` adds the log, not the trace). A command
that read a value no reader can use (``matrix.unreadable``: it showed that row as a failure) and succeeded
ends with one warning line: how many rows of the store hold such values, and the command that lists them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from matrix.errors import MatrixError
from matrix_cli.commands import COMMAND_MODULES

logger = logging.getLogger(__name__)

PROG = "grace-matrix"
INTERNAL_ERROR = 3


class OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors are one line on stderr (``prog: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class CommandParser(OneLineParser):
    """A subcommand parser with the common options; a module may redefine any of them."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("conflict_handler", "resolve")
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.set_defaults(command_parser=self)  # names the subcommand in errors of the whole command line
        common = self.add_argument_group("common options")
        common.add_argument(
            "--db",
            metavar="URL",
            type=store_url,
            default=None,
            help="store URL (default: GRACE_MATRIX_DB, else SQLite at .grace-matrix/store.sqlite)",
        )
        common.add_argument(
            "--config",
            metavar="PATH",
            default=None,
            help="the matrix file (default: GRACE_MATRIX_CONFIG, else ./matrix.toml)",
        )
        common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
        common.add_argument("-v", "--verbose", action="count", default=0, help="log progress (-vv: debug)")


def store_url(text: str) -> str:
    """``--db``'s value: an empty one (``--db "$UNSET"``) is refused, never taken for the default store."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty store URL; give one (sqlite:///path/store.sqlite), or leave --db out for the default"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Compatibility and regression matrix of grace over PyTorch x Triton x CUDA.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for name in COMMAND_MODULES:
        importlib.import_module(f"matrix_cli.commands.{name}").register(subparsers)
    for action in subparsers._choices_actions:  # a subcommand's help is its description unless it has one
        command = subparsers.choices[action.dest]
        if not command.description and action.help:
            command.description = action.help[0].upper() + action.help[1:] + "."
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PROG)
    except PackageNotFoundError:  # a source checkout that was never installed
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before the command ran (imports, the parser): the same one line
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # what the subcommand does not take: said by the subcommand's parser, which names it
        getattr(args, "command_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format=f"{PROG}: %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    watch = _StdoutWatch(sys.stdout)
    sys.stdout = watch  # type: ignore[assignment]
    try:
        return _dispatch(args, watch)
    finally:
        sys.stdout = watch.stream


class _StdoutWatch:
    """Standard output, remembering a write it could not make (a full disk, a vanished terminal), so that
    such a failure is told from an ``OSError`` of grace-matrix's own code."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.failure: OSError | None = None

    def write(self, text: str) -> int:
        return int(self._watched(self.stream.write, text))

    def flush(self) -> None:
        self._watched(self.stream.flush)

    def _watched(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.failure = exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _dispatch(args: argparse.Namespace, watch: _StdoutWatch) -> int:
    """Run the command; every failure becomes its exit status and one line (a bug: the traceback)."""
    from sqlalchemy.exc import SQLAlchemyError

    from matrix.store.db import default_url, describe_error
    from matrix.text import terminal_text
    from matrix.unreadable import watch as watch_unreadable

    try:
        with watch_unreadable() as met:
            code = int(args.handler(args))
        sys.stdout.flush()  # a failed write of the output shows here, not as an ignored error at exit
        if met.count and not getattr(args, "lists_unreadable", False):
            _warn_unreadable(args.db)
        return code
    except MatrixError as exc:
        print(terminal_text(f"{PROG}: error: {exc}"), file=sys.stderr)
        return exc.exit_code
    except SQLAlchemyError as exc:
        print(
            terminal_text(f"{PROG}: error: {describe_error(args.db or default_url(), exc)}"), file=sys.stderr
        )
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `grace-matrix ... | head`
        _drop_stdout(watch)
        return 0
    except OSError as exc:
        if exc is not watch.failure:
            return _internal_error(args.command)
        _drop_stdout(watch)  # what stays buffered is not written again at exit
        print(f"{PROG}: error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception:
        return _internal_error(args.command)


def _warn_unreadable(url: str | None) -> None:
    """The one line saying that the store holds rows no reader can use (read as failures)."""
    from sqlalchemy.exc import SQLAlchemyError

    from matrix.store.check import CHECK_COMMAND, count_unreadable
    from matrix.store.db import display_url
    from matrix.text import terminal_text

    try:
        count = count_unreadable(url)
    except (MatrixError, SQLAlchemyError):  # e.g. a store read through an export (--input): none there
        return
    if count:
        command = CHECK_COMMAND + (f" --db {display_url(url)}" if url else "")
        print(
            terminal_text(
                f"{PROG}: warning: {count} row(s) of the store hold values no reader can use (written by an "
                f"older grace-matrix or by hand), shown as failures with status unreadable; `{command}` "
                "lists them"
            ),
            file=sys.stderr,
        )


def _drop_stdout(watch: _StdoutWatch) -> None:
    with contextlib.suppress(OSError, ValueError):  # no file descriptor (a captured stream): nothing to do
        os.dup2(os.open(os.devnull, os.O_WRONLY), watch.stream.fileno())


def _internal_error(command: str) -> int:
    traceback.print_exc()
    print(f"{PROG}: internal error in `{command}` (a bug; the traceback is above)", file=sys.stderr)
    return INTERNAL_ERROR
