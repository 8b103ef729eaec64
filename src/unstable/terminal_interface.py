"""The original API's dashboard entry point: `python -m unstable.terminal_interface [RUN_DIR]`, the same as
`unstable dashboard [RUN_DIR]`.

Without RUN_DIR it attaches to the run under `./runs` whose metrics changed last.
"""

from __future__ import annotations

import sys

from unstable.cli.main import main as cli_main


def main(argv: list[str] | None = None) -> int:
    """Run `unstable dashboard` with these arguments (`--runs`, `--interval`, `--once`)."""
    return cli_main(["dashboard", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
