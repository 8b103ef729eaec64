"""Starting Ray on a loaded machine: Ray waits a fixed 30 s for its node to register and then gives up; the run
tries again instead of ending (seen on the 2-core VM at load average 20-30: one `unstable train` in four failed)."""

import pytest

from unstable.config import load_config
from unstable.runtime import topology

from .runs import EXAMPLE

TIMED_OUT = "The current node timed out during startup. This could happen because some of the raylet failed to startup or the GCS has become overloaded."  # noqa: E501 - Ray's own message


def _fake_ray(monkeypatch, failures: int) -> list[str]:
    """Ray whose `init` times out `failures` times and then starts; returns the calls made."""
    import ray

    calls = []

    def init(**kwargs):
        calls.append("init")
        if calls.count("init") <= failures:
            raise Exception(TIMED_OUT)

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    return calls


def test_a_node_that_times_out_at_startup_is_started_again(monkeypatch):
    calls = _fake_ray(monkeypatch, failures=2)
    topology.init_ray(load_config(EXAMPLE))
    assert calls == ["init", "shutdown", "init", "shutdown", "init"]


def test_ray_start_gives_up_with_the_cause_after_its_attempts(monkeypatch):
    _fake_ray(monkeypatch, failures=topology.RAY_START_ATTEMPTS)
    with pytest.raises(RuntimeError, match=f"Ray did not start in {topology.RAY_START_ATTEMPTS} attempts: The current"):
        topology.init_ray(load_config(EXAMPLE))


def test_other_ray_start_errors_are_not_retried(monkeypatch):
    import ray

    calls = []

    def init(**kwargs):
        calls.append("init")
        raise ValueError("bad address")

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ValueError, match="bad address"):
        topology.init_ray(load_config(EXAMPLE))
    assert calls == ["init"]
