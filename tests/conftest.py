"""Shared fixtures: offline hub settings and one tiny model built per test session; every test that loads the
tiny model is marked `slow` (`make check` runs the others)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny random Qwen3 model with a game-trained tokenizer (built once per session)."""
    from unstable.models.tiny import ensure_tiny_model

    return str(ensure_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3"))


@pytest.fixture
def one_torch_thread():
    """Run a test of tiny networks on one torch thread (many threads only contend on a shared CPU)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` every test that loads the tiny model, directly or through another fixture (the marker's
    meaning: runs a model or Ray); the tests that run Ray or a command carry the mark themselves."""
    for item in items:
        if "tiny_model_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
