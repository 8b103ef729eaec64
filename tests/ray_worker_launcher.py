"""Ray's worker launcher (`ray/_private/workers/setup_worker.py`) without importing Ray, for the tests' Ray nodes.

Ray starts every worker process through that script: one Python process imports Ray (0.3 CPU-s on the 2-core
machine) only to read the worker's runtime-env context and exec `python default_worker.py ...`, which imports Ray
again. The tests start ~280 workers, so the first import was ~90 CPU-s of a `make test`. This script does what
`RuntimeEnvContext.exec_worker` does for a Python worker on Linux (its environment variables, with `${X}` expanded as
Ray does; its command prefix; its Python; its entry point) with the standard library alone; anything else (another
language) goes to Ray's own script. The tests' nodes take it through `NODE_ARGS`.
"""

import argparse
import importlib.util
import json
import os
import re
import shlex
import sys
from pathlib import Path

NODE_ARGS = {"setup_worker_path": str(Path(__file__).resolve())}  # a node's keyword arguments that launch through this

parser = argparse.ArgumentParser()
parser.add_argument("--serialized-runtime-env-context")
parser.add_argument("--language")


def exec_python_worker(context: dict, worker_args: list[str]) -> None:
    """Replace this process with the worker, as `RuntimeEnvContext.exec_worker` does for Python."""
    for name, value in (context.get("env_vars") or {}).items():
        os.environ[name] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))
    if context.get("override_worker_entrypoint"):
        worker_args[0] = context["override_worker_entrypoint"]
    python = context.get("py_executable") or sys.executable
    command = [*(context.get("command_prefix") or []), "exec", python, *map(shlex.quote, worker_args)]
    os.execvp("bash", ["bash", "-c", " ".join(command)])


def exec_rays_launcher() -> None:
    """Replace this process with Ray's own launcher, given the same arguments."""
    ray_dir = Path(importlib.util.find_spec("ray").origin).parent  # found, not imported
    launcher = str(ray_dir / "_private" / "workers" / "setup_worker.py")
    os.execv(sys.executable, [sys.executable, launcher, *sys.argv[1:]])


if __name__ == "__main__":
    args, worker_args = parser.parse_known_args()
    if args.language != "PYTHON":
        exec_rays_launcher()
    exec_python_worker(json.loads(args.serialized_runtime_env_context or "{}"), worker_args)
