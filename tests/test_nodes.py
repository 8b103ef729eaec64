"""Several nodes, the plain parts: a checkpoint reaches an inference server on a node that cannot see the run
directory in chunks, copied into that node's own bounded cache, from which the server loads it
(`test_ray_cluster` runs the same through Ray on a simulated two-node cluster)."""

import json
import os
import tempfile
import threading
from pathlib import Path

import pytest

from unstable.inference import InferenceConfig, InferenceServer
from unstable.inference.base import InferenceBackend
from unstable.inference.checkpoints import CACHE_DIR, CheckpointCache, CheckpointFiles
from unstable.records import Checkpoint, GenerationRequest, GenerationResult
from unstable.tracking import keys


def _checkpoint(tmp_path: Path, name: str) -> Checkpoint:
    """A checkpoint directory `tmp_path/run/checkpoints/name` holding a config and some bytes in a subfolder."""
    directory = tmp_path / "run" / "checkpoints" / name
    (directory / "sub").mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"name": name}))
    (directory / "sub" / "weights.bin").write_bytes(name.encode() * 1000)
    return Checkpoint(uid=name, path=str(directory), version=int(name.split("-")[1]))


class _Fetcher(CheckpointFiles):
    """The 'other node's' `CheckpointFiles`, counting the checkpoints listed and the largest answer; `gate` holds
    every listing until it is set."""

    def __init__(self, chunk_bytes: int = 1 << 20):
        super().__init__(chunk_bytes)
        self.calls: list[str] = []
        self.largest_answer = 0
        self.gate = threading.Event()
        self.gate.set()

    def files(self, path: str) -> list[tuple[str, int]]:
        self.calls.append(path)
        self.gate.wait(timeout=10)
        return super().files(path)

    def read(self, path: str, name: str, offset: int) -> bytes:
        data = super().read(path, name, offset)
        self.largest_answer = max(self.largest_answer, len(data))
        return data


def test_a_checkpoint_from_another_node_is_copied_once_into_a_bounded_cache(tmp_path):
    fetch = _Fetcher()
    cache = CheckpointCache(fetch, capacity=2, root=tmp_path / "cache")
    first, second, third = (_checkpoint(tmp_path, f"ckpt-{k}") for k in (1, 2, 3))
    local = cache.local(first)
    assert local.uid == first.uid and local.version == 1 and Path(local.path).parent == tmp_path / "cache"
    assert (Path(local.path) / "sub" / "weights.bin").read_bytes() == b"ckpt-1" * 1000
    assert cache.local(first) == local and fetch.calls == [first.path]  # copied once
    fetch.gate.clear()
    threads = [threading.Thread(target=cache.local, args=(second,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    fetch.gate.set()
    for thread in threads:
        thread.join(timeout=10)
    assert fetch.calls == [first.path, second.path]  # eight requests at once: one fetch
    cache.local(third)  # beyond the capacity: the least recently used one goes
    assert not Path(local.path).exists() and len(list((tmp_path / "cache").iterdir())) == 2
    stats = cache.stats()
    assert stats[keys.INFERENCE_CHECKPOINTS_FETCHED] == 3 and stats[keys.INFERENCE_CHECKPOINT_BYTES] > 3 * 3000
    assert cache.stats()[keys.INFERENCE_CHECKPOINTS_FETCHED] == 0  # counted since the last reading
    assert cache.local(first).path == local.path and len(fetch.calls) == 4  # named again: fetched again
    base = Checkpoint(uid="ckpt--1")
    assert cache.local(base) is base and cache.local(None) is None  # the base model: nothing to fetch
    cache.close()
    assert not (tmp_path / "cache").exists()


def test_a_checkpoint_travels_in_chunks_so_no_call_holds_a_whole_model(tmp_path):
    """Each call carries at most `chunk_bytes` (it packed the whole directory in memory per call before: N actors x 2
    x the model on the checkpoints' node), and the copied files are the checkpoint's, byte for byte."""
    checkpoint = _checkpoint(tmp_path, "ckpt-1")
    weights = Path(checkpoint.path) / "sub" / "weights.bin"
    weights.write_bytes(os.urandom(10_000))
    fetch = _Fetcher(chunk_bytes=1024)
    cache = CheckpointCache(fetch, capacity=1, root=tmp_path / "cache")
    local = Path(cache.local(checkpoint).path)
    assert (local / "sub" / "weights.bin").read_bytes() == weights.read_bytes()
    assert json.loads((local / "adapter_config.json").read_text()) == {"name": "ckpt-1"}
    assert fetch.largest_answer == 1024 and cache.stats()[keys.INFERENCE_CHECKPOINT_BYTES] > 10_000


def test_reading_a_missing_checkpoint_or_a_file_outside_it_says_which(tmp_path):
    files = CheckpointFiles()
    with pytest.raises(FileNotFoundError, match="ckpt-9"):
        files.files(str(tmp_path / "ckpt-9"))
    checkpoint = _checkpoint(tmp_path, "ckpt-1")
    with pytest.raises(ValueError, match="outside"):
        files.read(checkpoint.path, "../../secret", 0)


def test_a_new_cache_deletes_those_of_processes_no_longer_alive(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / CACHE_DIR / "4194305"  # above Linux's largest pid: never alive
    (dead / "ckpt-1").mkdir(parents=True)
    alive = tmp_path / CACHE_DIR / "1"  # init
    alive.mkdir()
    cache = CheckpointCache(_Fetcher(), capacity=1)
    assert cache.root == tmp_path / CACHE_DIR / str(os.getpid())
    assert not dead.exists() and alive.exists()
    cache.close()
    with pytest.raises(RuntimeError, match="closed"):
        cache.local(_checkpoint(tmp_path, "ckpt-1"))


class _AdapterBackend(InferenceBackend):
    """Answers every request at once and records the path each adapter was loaded from."""

    def __init__(self):
        self.loaded_from: dict[str, str] = {}

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult("x", (1,), (2,), (-0.5,)) for _ in requests]

    def load_adapter(self, checkpoint: Checkpoint) -> None:
        assert (Path(checkpoint.path) / "adapter_config.json").exists()
        self.loaded_from[checkpoint.uid] = checkpoint.path

    def unload_adapter(self, uid: str) -> None:
        pass

    def load_weights(self, path: str) -> None:
        raise AssertionError("no full checkpoint here")


def test_a_server_with_a_cache_loads_adapters_from_it_and_names_them_as_requested(tmp_path):
    backend = _AdapterBackend()
    cache = CheckpointCache(_Fetcher(), capacity=4, root=tmp_path / "cache")
    server = InferenceServer(lambda: backend, InferenceConfig(batch_wait_ms=0), checkpoints=cache)
    server.start()
    try:
        checkpoint = _checkpoint(tmp_path, "ckpt-1")
        result = server.generate(GenerationRequest("prompt", checkpoint))
        assert result.served_by == checkpoint  # as the request named it, for the step's version
        assert Path(backend.loaded_from["ckpt-1"]).parent == tmp_path / "cache"
        assert server.stats()[keys.INFERENCE_CHECKPOINTS_FETCHED] == 1
    finally:
        server.stop()
    assert not (tmp_path / "cache").exists()  # a stopped server leaves nothing on its node
