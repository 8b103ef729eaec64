"""How the tests' Ray nodes start their worker processes: forked from a process that has imported what the package's
actors import, or, without one, as Ray starts them but without Ray's own launcher.

Ray starts every worker through `ray/_private/workers/setup_worker.py`: one Python process imports Ray (0.3 CPU-s on
the 2-core machine) to read the worker's runtime-env context, then execs `python default_worker.py ...`, which imports
Ray again (0.5 CPU-s) and, in the learner and inference actors, torch and transformers' Qwen3 model (3.4 CPU-s), all
before the actor does anything; `make test` starts ~280 workers. The nodes take this script as their launcher
(`NODE_ARGS`). It applies the runtime-env context as `RuntimeEnvContext.exec_worker` does for a Python worker on
Linux (its variables, `${X}` expanded as Ray expands them; its command prefix; its Python; its entry point), then:

- with a zygote (`start_zygote`, its socket in `ZYGOTE_ENV` when the node starts) and no command prefix or other
  Python: hands the zygote its standard streams, environment, directory and arguments; the zygote forks a child that
  runs `default_worker.py` as `__main__` with them (Ray's own import still runs in each). The worker registers itself
  with the raylet, its pid included; this launcher stays as the raylet's child until the worker ends, and the worker
  ends when the launcher dies, as an exec'd worker dies with its process. The zygote is single-threaded when it
  forks, so nothing it holds is left locked in a child;
- otherwise: execs `python default_worker.py ...`, as Ray's launcher does;
- another language: Ray's own launcher.
"""

import argparse
import array
import ast
import importlib.util
import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

NODE_ARGS = {"setup_worker_path": str(Path(__file__).resolve())}  # a node's keyword arguments that launch through this
ZYGOTE_ENV = "UNSTABLE_TEST_RAY_WORKER_ZYGOTE"  # the zygote's socket; nodes started with it set launch through it
LAUNCHER_ENV = "UNSTABLE_TEST_RAY_WORKER_LAUNCHER"  # in a forked worker: its launcher's pid
# what the actors import, but not Ray: Ray's C++ settings read the environment once per process, RAY_JOB_ID (which
# the raylet sets per worker) among them, so the workers of a zygote that had imported Ray held its empty one and hung
ZYGOTE_PRELOAD = [
    "torch",
    "transformers.models.qwen3.modeling_qwen3",
    "peft",
    "textarena",
    "unstable.algorithms",
    "unstable.buffer",
    "unstable.collector",
    "unstable.inference.transformers_backend",
    "unstable.learner.parallel",
    "unstable.pool",
    "unstable.tracking",
]
STREAMS = 3  # stdin, stdout, stderr
STREAMS_SENT = b"S"  # the byte the streams' descriptors travel with

parser = argparse.ArgumentParser()
parser.add_argument("--serialized-runtime-env-context")
parser.add_argument("--language")
parser.add_argument("--zygote", help="serve as a zygote on this socket path")


def launch(context: dict, worker_args: list[str]) -> None:
    """Start the worker `worker_args` names with the runtime-env `context`: from the zygote if there is one and the
    context allows, else by exec."""
    for name, value in (context.get("env_vars") or {}).items():
        os.environ[name] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))
    if context.get("override_worker_entrypoint"):
        worker_args[0] = context["override_worker_entrypoint"]
    python = context.get("py_executable") or sys.executable
    prefix = context.get("command_prefix") or []
    zygote = os.environ.get(ZYGOTE_ENV)
    if zygote and not prefix and python == sys.executable and worker_args[0].endswith(".py"):
        try:
            worker = _forked_by(zygote, worker_args)
        except (OSError, ValueError):  # the zygote is gone (its test process ended first): started by exec instead
            pass
        else:
            _wait_for(worker)
            os._exit(0)  # the raylet learns how the worker ended from the worker's own connection
    command = [*prefix, "exec", python, *map(shlex.quote, worker_args)]
    os.execvp("bash", ["bash", "-c", " ".join(command)])


def _forked_by(zygote: str, worker_args: list[str]) -> int:
    """Ask the zygote at socket `zygote` for the worker: its pid."""
    request = {"argv": worker_args, "env": dict(os.environ), "cwd": os.getcwd(), "launcher": os.getpid()}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(zygote)
        streams = array.array("i", range(STREAMS))
        connection.sendmsg([STREAMS_SENT], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, streams)])
        connection.sendall(repr(request).encode())
        connection.shutdown(socket.SHUT_WR)
        return int(_read_all(connection))


def _wait_for(pid: int) -> None:
    """Return when the process `pid` (not this one's child) has ended."""
    try:
        ended = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    select.select([ended], [], [])


def _read_all(connection: socket.socket) -> bytes:
    """Everything the peer sends until it shuts its side."""
    chunks = []
    while chunk := connection.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def start_zygote(ready_timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start a zygote; returns its process and its socket's path, once it serves."""
    path = str(Path(tempfile.mkdtemp(prefix="rz", dir="/tmp")) / "socket")
    process = subprocess.Popen([sys.executable, __file__, "--zygote", path], stdin=subprocess.DEVNULL)
    deadline = time.time() + ready_timeout
    while not os.path.exists(path):
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            raise RuntimeError(f"the Ray worker zygote did not start (status {process.wait()})")
        time.sleep(0.05)
    return process, path


def serve(path: str) -> None:
    """Preload, then fork a worker for each request on a socket at `path`, until killed or its parent (the test
    process) ends."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.zygote runs each worker
    import tests.zygote  # noqa: F401 - imported before the forks, as the preloads are
    from unstable.runtime.topology import _forwarded_env

    os.environ.update(_forwarded_env())  # what every run gives its actors, set before the modules that read it load
    for module in ZYGOTE_PRELOAD:
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    server.listen(64)
    parent = os.pidfd_open(os.getppid())
    os.rename(path + ".tmp", path)
    while parent not in select.select([server, parent], [], [])[0]:
        connection, _ = server.accept()
        with connection:
            try:
                _fork_worker(connection, closed_in_child=(server.fileno(), parent))
            except OSError:  # the launcher died while asking: its worker, if forked, ends with it
                continue


def _fork_worker(connection: socket.socket, closed_in_child: tuple[int, ...]) -> None:
    """Read one launcher's request on `connection`, fork its worker and answer with the worker's pid."""
    streams = array.array("i")
    _, ancillary, _, _ = connection.recvmsg(len(STREAMS_SENT), socket.CMSG_LEN(STREAMS * streams.itemsize))
    for _, _, data in ancillary:
        streams.frombytes(data)
    request = ast.literal_eval(_read_all(connection).decode())
    pid = os.fork()
    if pid == 0:
        for fd in (*closed_in_child, connection.fileno()):
            os.close(fd)
        _become_worker(request, list(streams))
    for fd in streams:
        os.close(fd)
    connection.sendall(str(pid).encode())


def _become_worker(request: dict, streams: list[int]) -> None:
    """In the forked child: the launcher's streams, environment, directory and arguments, then Ray's worker."""
    from tests.zygote import run_as_main

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
        os.close(fd)
    _end_with(request["launcher"])
    run_as_main(request["argv"], request["cwd"], request["env"] | {LAUNCHER_ENV: str(request["launcher"])})


def _end_with(launcher: int) -> None:
    """SIGKILL to this process once the process `launcher` ends."""

    def watch() -> None:
        _wait_for(launcher)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="launcher-watch").start()


def _exec_rays_launcher() -> None:
    """Replace this process with Ray's own launcher, given the same arguments."""
    ray_dir = Path(importlib.util.find_spec("ray").origin).parent  # found, not imported
    launcher = str(ray_dir / "_private" / "workers" / "setup_worker.py")
    os.execv(sys.executable, [sys.executable, launcher, *sys.argv[1:]])


if __name__ == "__main__":
    args, worker_args = parser.parse_known_args()
    if args.zygote:
        serve(args.zygote)
    elif args.language != "PYTHON":
        _exec_rays_launcher()
    else:
        launch(json.loads(args.serialized_runtime_env_context or "{}"), worker_args)
