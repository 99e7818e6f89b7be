"""`python -m lookahead.server [serve options]`: the same as `lookahead serve [options]`."""

from __future__ import annotations

import argparse
import sys

from lookahead.server.cli import add_arguments, serve_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lookahead.server", description="Same as `lookahead serve`.")
    add_arguments(parser)
    return serve_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
