"""The seed's dashboard entry point: `python -m unstable.terminal_interface [RUN_DIR]`.

Without RUN_DIR it attaches to the run under `./runs` whose metrics changed last.
"""

from __future__ import annotations

import argparse
import sys

from unstable.dashboard import watch
from unstable.tracking.history import find_latest_run


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and show the run until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m unstable.terminal_interface", description=__doc__)
    parser.add_argument("run_dir", nargs="?", default=None, help="a run directory (default: the latest under --runs)")
    parser.add_argument("--runs", default="runs", help="where to look for the latest run")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    args = parser.parse_args(argv)
    try:
        run_dir = args.run_dir or find_latest_run(args.runs)
        watch(run_dir, args.interval, once=args.once)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
