"""The tests' Ray nodes start their workers through tests/ray_worker_launcher.py, and a worker started that way gets
what Ray's own launcher gives it: the runtime env's variables (`${X}` expanded, an unset one empty) and Python."""

import os
import sys

import psutil
import pytest

pytestmark = pytest.mark.slow  # starts Ray


def test_a_worker_launched_without_importing_ray_sees_its_runtime_env_as_rays_launcher_gives_it(shared_ray):
    import ray

    commands = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
    raylet = [c for c in commands if "raylet/raylet" in c and f"--gcs-address={shared_ray}" in c]
    assert len(raylet) == 1 and "ray_worker_launcher.py" in raylet[0]

    @ray.remote(num_cpus=0)
    def worker_env() -> tuple[dict[str, str], str, str]:
        return {name: os.environ.get(name) for name in ("FIRST", "SECOND", "THIRD")}, sys.executable, sys.argv[0]

    env_vars = {"FIRST": "one", "SECOND": "${FIRST}-two", "THIRD": "${UNSET_IN_THE_WORKER}three"}
    ray.init(address=shared_ray, runtime_env={"env_vars": env_vars})
    try:
        seen, python, entry_point = ray.get(worker_env.remote(), timeout=120)
    finally:
        ray.shutdown()
    assert seen == {"FIRST": "one", "SECOND": "one-two", "THIRD": "three"}
    assert python == sys.executable and entry_point.endswith("default_worker.py")
