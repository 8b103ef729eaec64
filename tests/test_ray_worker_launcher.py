"""The tests' Ray nodes start their workers through tests/ray_worker_launcher.py: forked from a zygote that has
imported torch, a worker gets what Ray's own launcher gives it (the runtime env's variables, `${X}` expanded and an
unset one empty; Python; Ray's worker as its entry point), and it lives and dies with its launcher, the raylet's
child."""

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from .ray_worker_launcher import NODE_ARGS, ZYGOTE_ENV


@pytest.mark.slow  # starts Ray
def test_a_worker_forked_from_the_zygote_sees_its_runtime_env_and_ends_with_its_launcher(shared_ray):
    import ray

    commands = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
    raylet = [c for c in commands if "raylet/raylet" in c and f"--gcs-address={shared_ray}" in c]
    assert len(raylet) == 1 and "ray_worker_launcher.py" in raylet[0]

    @ray.remote(num_cpus=0)
    class Probe:
        def seen(self) -> dict:
            names = ("FIRST", "SECOND", "THIRD", "UNSTABLE_TEST_RAY_WORKER_LAUNCHER")
            return {
                "env": {name: os.environ.get(name) for name in names},
                "python": sys.executable,
                "entry_point": sys.argv[0],
                "torch_preloaded": "torch" in sys.modules,
                "pid": os.getpid(),
                "parent": os.getppid(),
            }

    env_vars = {"FIRST": "one", "SECOND": "${FIRST}-two", "THIRD": "${UNSET_IN_THE_WORKER}three"}
    ray.init(address=shared_ray, runtime_env={"env_vars": env_vars})
    try:
        seen = ray.get(Probe.remote().seen.remote(), timeout=120)
        launcher = psutil.Process(int(seen["env"].pop("UNSTABLE_TEST_RAY_WORKER_LAUNCHER")))
        assert seen["env"] == {"FIRST": "one", "SECOND": "one-two", "THIRD": "three"}
        assert seen["python"] == sys.executable and seen["entry_point"].endswith("default_worker.py")
        assert seen["torch_preloaded"] and "--zygote" in psutil.Process(seen["parent"]).cmdline()
        assert "raylet" in launcher.parent().name() and "ray_worker_launcher.py" in " ".join(launcher.cmdline())
        launcher.kill()  # as the raylet kills a worker it started
        assert psutil.wait_procs([psutil.Process(seen["pid"])], timeout=30)[1] == []  # the worker ended with it
        other = ray.get(Probe.remote().seen.remote(), timeout=120)
        launcher = psutil.Process(int(other["env"]["UNSTABLE_TEST_RAY_WORKER_LAUNCHER"]))
        psutil.Process(other["pid"]).kill()  # as a test kills an actor's process
        assert psutil.wait_procs([launcher], timeout=30)[1] == []  # its launcher, the raylet's child, ended with it
    finally:
        ray.shutdown()


@pytest.mark.slow  # the zygote imports torch and transformers
def test_a_zygote_ends_with_the_process_that_started_it():
    """A test process killed (or one that never tears down) leaves no zygote behind."""
    starter = "import os\nfrom tests.ray_worker_launcher import start_zygote\nprint(start_zygote()[0].pid)\nos._exit(0)"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", starter], cwd=root, capture_output=True, text=True, timeout=120)
    zygote = psutil.Process(int(done.stdout))
    assert psutil.wait_procs([zygote], timeout=30)[1] == []


def test_without_its_zygote_the_launcher_execs_the_worker_with_its_runtime_env(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text("import os, sys\nprint(os.environ['SECOND'], sys.argv[1:])\n")
    context = json.dumps({"env_vars": {"FIRST": "one", "SECOND": "${FIRST}-two"}, "command_prefix": []})
    command = [sys.executable, NODE_ARGS["setup_worker_path"], f"--serialized-runtime-env-context={context}"]
    command += ["--language=PYTHON", str(worker), "--x=1"]
    env = os.environ | {ZYGOTE_ENV: str(tmp_path / "no-zygote-here")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "one-two ['--x=1']\n"), done.stderr
