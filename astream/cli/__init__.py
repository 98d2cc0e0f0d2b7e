"""The ``astream`` command: inspect, plan, convert, verify, serve and benchmark MDS datasets; look at a cache.

Each subcommand lives in its own module (``_inspect``, ``_convert``, ...) with an
``add_parser(subparsers, common)`` that declares its arguments and a ``run(args)`` that
returns the exit code. This module only wires them together and turns failures into
one line on stderr: exit code 2 for bad arguments, 1 for everything else, and the
traceback only with ``--debug``.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import NoReturn

from astream.cli._bench import add_parser as _add_bench
from astream.cli._bench_compare import add_parser as _add_bench_compare
from astream.cli._cache import add_parser as _add_cache
from astream.cli._convert import add_parser as _add_convert
from astream.cli._index import add_parser as _add_index
from astream.cli._inspect import add_parser as _add_inspect
from astream.cli._output import CommandError
from astream.cli._plan import add_parser as _add_plan
from astream.cli._serve import add_parser as _add_serve
from astream.cli._verify import add_parser as _add_verify
from astream.errors import AstreamError, ConfigError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with where to find help) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``astream`` command and all its subcommands."""
    # SUPPRESS: a flag given before the subcommand is not reset by the subcommand's default.
    common = _Parser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress bars or chatter, only results and errors")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of an error")
    parser = _Parser(prog="astream", description="Stream MDS datasets without torch.", parents=[common])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in (_add_inspect, _add_plan, _add_convert, _add_verify, _add_serve, _add_bench, _add_bench_compare,
                       _add_index, _add_cache):
        add_parser(sub, common)
    demo = sub.add_parser("demo", parents=[common], help="write a small dataset, inspect it, stream it and resume")
    demo.add_argument("--dir", default=".demo", help="where to write the demo dataset (default: .demo)")
    demo.set_defaults(func=_run_demo)
    return parser


def _run_demo(args: argparse.Namespace) -> int:
    from astream.cli._demo import run_demo

    return int(run_demo(args.dir))


def _two_words(argv: list[str]) -> list[str]:
    """``bench compare`` is the subcommand ``bench-compare`` (``bench`` itself takes a URL)."""
    words = [i for i, a in enumerate(argv) if not a.startswith("-")]
    if len(words) >= 2 and argv[words[0]] == "bench" and argv[words[1]] == "compare" and words[1] == words[0] + 1:
        return [*argv[:words[0]], "bench-compare", *argv[words[1] + 1:]]
    return argv


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``astream`` console script; returns the exit code."""
    args = build_parser().parse_args(_two_words(sys.argv[1:] if argv is None else list(argv)))
    debug = bool(getattr(args, "debug", False))
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return _fail("interrupted", 130, debug)
    except CommandError as exc:
        return _fail(str(exc), exc.code, debug)
    except ConfigError as exc:
        return _fail(str(exc), 2, debug)
    except (AstreamError, OSError) as exc:
        return _fail(str(exc) or type(exc).__name__, 1, debug)
    except Exception as exc:
        # A bug, not bad input: still one line, but say what to send with a report.
        return _fail(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", 1, debug)


def _fail(message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    first = message.strip().splitlines()[0] if message.strip() else "failed"
    print(f"astream: error: {first}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
