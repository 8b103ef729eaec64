"""Python commands run as forks of one process that has imported torch, transformers, peft, Ray and the package.

A script started with `python script.py` spends 3-4 CPU-s importing those before it does anything (torch 1.1,
transformers' Qwen3 model 2.3 on the 2-core machine); the benchmark and experiment smokes start about 25, the tests ~20
`unstable train` drivers. Each pytest-xdist worker starts one multiprocessing forkserver with those modules preloaded,
and `start_python` (to watch or kill the command as it runs, as `subprocess.Popen` does) or `run_python` (to its end)
forks a child of it per command: the child takes the command's environment, working directory and arguments, then runs
the script or module as `__main__` (its own imports still run: a module already imported is only looked up). The
forkserver is single-threaded when it forks, so nothing it holds is left locked in the child.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from .ray_worker_launcher import ZYGOTE_PRELOAD

# the Ray workers' zygote's modules, and Ray with the modules that import it
PRELOAD = [*ZYGOTE_PRELOAD, "ray", "unstable.cli.main", "unstable.runtime.actors", "unstable.runtime.learner_actors"]


@dataclass
class Finished:
    """What a command left: its exit status and its standard output and error."""

    returncode: int
    stdout: str
    stderr: str


class Forked:
    """A command `start_python` started, used as a `subprocess.Popen` of it is: `pid`, `poll()`, `wait(timeout)`,
    `communicate(timeout)` (its two streams as bytes; stderr empty when merged into stdout) and `returncode`."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], new_session: bool, merge_stderr: bool):
        self._streams = tempfile.TemporaryDirectory()
        self._out = Path(self._streams.name, "stdout")
        self._err = self._out if merge_stderr else Path(self._streams.name, "stderr")
        self._err.touch()
        args = (argv, str(cwd), env, str(self._out), str(self._err), new_session)
        self._child = _forkserver().Process(target=_run, args=args)
        self._child.start()
        self.pid = self._child.pid

    @property
    def returncode(self) -> int | None:
        """The exit status (-N: killed by signal N), None while it runs."""
        return self._child.exitcode

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status once it ends; `subprocess.TimeoutExpired` after `timeout` seconds."""
        self._child.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self._child.name, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        """Its standard output and error once it ends; `subprocess.TimeoutExpired` after `timeout` seconds."""
        self.wait(timeout)
        return self._out.read_bytes(), b"" if self._err == self._out else self._err.read_bytes()

    def kill(self) -> None:
        """SIGKILL to the command's process."""
        self._child.kill()


def start_python(
    argv: list[str], *, cwd: Path, env: dict[str, str], new_session: bool = False, merge_stderr: bool = False
) -> Forked:
    """Start `python *argv` (a script's path, or `-m` and a module, then its arguments) in `cwd` with exactly `env`,
    as a fork of this worker's forkserver; `new_session`: in a session (and process group) of its own, as
    `Popen(start_new_session=True)` starts it; `merge_stderr`: its standard error into its standard output."""
    return Forked(argv, cwd, env, new_session, merge_stderr)


def run_python(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> Finished:
    """`python *argv` as `start_python` starts it, to its end. A command still running after `timeout` seconds is
    killed (status -9)."""
    child = start_python(argv, cwd=cwd, env=env)
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    out, err = child.communicate()
    return Finished(child.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


@functools.cache
def _forkserver():
    """This process's forkserver context, its preloads set at the first call."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _run(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str, new_session: bool) -> None:
    """In the forked child: its session, the command's streams, environment, directory and arguments, then the
    command; exits with its status after its exit handlers, as `python` does."""
    if new_session:
        os.setsid()
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), fd)
    run_as_main(argv, cwd, env)


def run_as_main(argv: list[str], cwd: str, env: dict[str, str]) -> NoReturn:
    """In a forked child, its streams set: `python *argv` in `cwd` with exactly `env`; exits with its status after
    its exit handlers, as `python` does."""
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
