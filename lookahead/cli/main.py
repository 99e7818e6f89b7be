"""`lookahead` command line. Subcommands: generate (here), and those registered by other packages."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from lookahead.cli.generate_cmd import register as register_generate
from lookahead.errors import LookaheadError

# Packages that add subcommands through a `register(subparsers)` function.
_SUBCOMMAND_MODULES = ("lookahead.bench.cli", "lookahead.server.cli")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's default prints usage too)
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lookahead", description="Lossless lookahead decoding for Hugging Face causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    register_generate(sub)
    for name in _SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except LookaheadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
