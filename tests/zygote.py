"""Python commands run as forks of one process that has imported torch, transformers, peft, Ray and the package.

A script started with `python script.py` spends 3-4 CPU-s importing those before it does anything (torch 1.1,
transformers' Qwen3 model 2.3 on the 2-core machine); the benchmark and experiment smokes start about 25. Each
pytest-xdist worker starts one multiprocessing forkserver with those modules preloaded, and `run_python` forks a
child of it per command: the child takes the command's environment, working directory and arguments, then runs the
script or module as `__main__` (its own imports still run: a module already imported is only looked up). The
forkserver is single-threaded when it forks, so nothing it holds is left locked in the child.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import runpy
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

PRELOAD = [
    "torch",
    "transformers.models.qwen3.modeling_qwen3",
    "peft",
    "ray",
    "textarena",
    "unstable.cli.main",
    "unstable.runtime.actors",
    "unstable.runtime.learner_actors",
    "unstable.inference.transformers_backend",
]


@dataclass
class Finished:
    """What a command left: its exit status and its standard output and error."""

    returncode: int
    stdout: str
    stderr: str


def run_python(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> Finished:
    """`python *argv` (a script's path, or `-m` and a module, then its arguments) in `cwd` with exactly `env`, as a
    fork of this worker's forkserver. A command still running after `timeout` seconds is killed (status -9)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        child = _forkserver().Process(target=_run, args=(argv, str(cwd), env, str(out), str(err)))
        child.start()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
        return Finished(child.exitcode, out.read_text(errors="replace"), err.read_text(errors="replace"))


@functools.cache
def _forkserver():
    """This process's forkserver context, its preloads set at the first call."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _run(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: the command's streams, environment, directory and arguments, then the command; exits
    with its status after its exit handlers, as `python` does."""
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    status = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, cwd)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException:  # noqa: BLE001 - a command's uncaught error: its traceback and status 1, as python gives
        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _exit_status(code) -> int:
    """The status `sys.exit(code)` gives: 0 for None, the number, or 1 with the message on stderr."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1
