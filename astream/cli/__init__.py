"""The ``astream`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``astream`` console script."""
    parser = argparse.ArgumentParser(prog="astream", description="Stream MDS datasets without torch.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="write a small dataset, inspect it and read it back")
    demo.add_argument("--dir", default=".demo", help="where to write the demo dataset (default: .demo)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from astream.cli._demo import run_demo

        return int(run_demo(args.dir))
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
