"""Shared fixtures: offline hub settings and one tiny model built per test session; every test that loads the
tiny model is marked `slow` (`make check` runs the others)."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # beside another worker, a second OpenMP thread of the tests' own models mostly spins waiting for a busy core
    # (in-process model tests under `make test`: 85 -> 70 CPU-s)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from filelock import FileLock  # noqa: E402

from .ray_worker_launcher import NODE_ARGS, ZYGOTE_ENV, start_zygote  # noqa: E402


@contextmanager
def built_once(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """The path `name` in a directory every pytest-xdist worker of this test run shares, held under a file lock: a
    fixture that builds into it only when it is missing is built once for all workers (each worker's module and
    session fixtures are otherwise its own)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the test run's base directory, which holds each worker's own
    path = root / name
    with FileLock(f"{path}.lock"):
        yield path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny random Qwen3 model with a game-trained tokenizer (built once per test run)."""
    from unstable.models.tiny import ensure_tiny_model

    with built_once(tmp_path_factory, "tiny-qwen3") as path:
        return str(ensure_tiny_model(path))


HEAD_NODE = {"num_cpus": 4, "include_dashboard": False, "include_log_monitor": False, "no_monitor": True, **NODE_ARGS}


@pytest.fixture(scope="session")
def _ray_head() -> Iterator[str]:
    """One Ray head node per test process (each pytest-xdist worker), started at its first use and kept to the end:
    the address runs join instead of each starting and stopping a Ray of its own (~3-8 CPU-s and seconds of wall time
    per run). Four logical CPUs: a run with two inference actors and its learner reserves three. Its address file
    goes to a temporary directory of its own, so only a run given its address (`shared_ray`) joins it. No log monitor
    (actors' output reaches no driver: runs log to their own files) and no autoscaler monitor, which poll all along
    (an idle head: 1.50 -> 1.13 CPU-s a minute). Its workers are forked from a zygote that has imported torch and
    transformers (tests/ray_worker_launcher.py)."""
    from ray.cluster_utils import Cluster

    zygote, zygote_socket = start_zygote()
    saved = {name: os.environ.get(name) for name in ("RAY_TMPDIR", "RAY_prestart_worker_first_driver", ZYGOTE_ENV)}
    temp_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths live in it
    os.environ |= {"RAY_TMPDIR": temp_dir, "RAY_prestart_worker_first_driver": "0", ZYGOTE_ENV: zygote_socket}
    try:
        cluster = Cluster(initialize_head=True, head_node_args=HEAD_NODE)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    yield cluster.address
    cluster.shutdown()
    zygote.kill()
    shutil.rmtree(temp_dir, ignore_errors=True)
    shutil.rmtree(Path(zygote_socket).parent, ignore_errors=True)


@pytest.fixture
def shared_ray(_ray_head, monkeypatch) -> str:
    """Runs of this test (in process, or commands it starts) join the test process's Ray head through RAY_ADDRESS,
    as a run joins a cluster: each run is one Ray job, whose actors Ray ends with it. Not for tests that start a Ray
    of their own (pretend GPUs, two nodes)."""
    monkeypatch.setenv("RAY_ADDRESS", _ray_head)
    return _ray_head


@pytest.fixture
def one_torch_thread():
    """Run a test of tiny networks on one torch thread (many threads only contend on a shared CPU)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# fixtures built once for all workers (`built_once`) that take a worker many seconds; not the tiny model: nearly every
# slow test needs it, so no order spares the other worker its wait
SHARED_BUILDS = frozenset({"sft_adapter"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` every test that loads the tiny model, directly or through another fixture (the marker's
    meaning: runs a model or Ray), and every `long` one; the tests that run Ray or a command carry the mark
    themselves. Then the `long` tests go first, the other slow ones next, each file's in its order, the short ones
    last: `make test` hands pytest-xdist's workers one test at a time (`--maxschedchunk 1`), so the runs of minutes
    start early, spread over both workers, and the many short tests fill the end, where a worker would otherwise wait
    for the other's last long run. Of the tests using one of `SHARED_BUILDS` only the first stays in its place; the
    others follow the slow ones, so the first builds it while the other worker runs something else instead of waiting
    on its lock (the SFT adapter: 21 s of a worker waiting)."""
    for item in items:
        if "tiny_model_dir" in getattr(item, "fixturenames", ()) or item.get_closest_marker("long"):
            item.add_marker(pytest.mark.slow)

    builders: set[str] = set()

    def order(item: pytest.Item) -> float:
        if item.get_closest_marker("long"):
            return 0
        if not (item.get_closest_marker("slow") or item.get_closest_marker("vllm")):
            return 2
        shared = set(getattr(item, "fixturenames", ())) & SHARED_BUILDS
        if shared and shared <= builders:  # built by an earlier test
            return 1.5
        builders.update(shared)
        return 1

    items.sort(key=order)
