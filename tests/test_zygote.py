"""`tests/zygote.py`: a command forked from the preloaded process ends as `python` would end it: its status, its two
streams, its directory, exactly its environment, and a command past its time killed."""

import os
import signal
import subprocess
import sys

import pytest

from .zygote import run_python, start_python

pytestmark = pytest.mark.slow  # starts the forkserver, which imports torch and transformers

SCRIPT = """
import os, sys
print("cwd", os.getcwd(), "argv", sys.argv[1:], "only", sorted(k for k in os.environ if k.startswith("ZYGOTE_")))
print("to stderr", file=sys.stderr)
how = sys.argv[1]
if how == "raise":
    raise ValueError("a script's error")
if how == "message":
    sys.exit("stopped: a message")
if how == "sleep":
    import time
    time.sleep(60)
sys.exit(int(how))
"""


@pytest.mark.parametrize(
    ("how", "status", "in_stderr"),
    [("0", 0, "to stderr"), ("3", 3, "to stderr"), ("raise", 1, "ValueError: a script's error"),
     ("message", 1, "stopped: a message")],
)  # fmt: skip
def test_a_forked_command_ends_as_python_ends_it(tmp_path, how, status, in_stderr):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {"PATH": os.environ["PATH"], "ZYGOTE_A": "1"}
    done = run_python([str(script), how], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == status, done.stderr
    assert f"cwd {tmp_path} argv ['{how}'] only ['ZYGOTE_A']" in done.stdout
    assert in_stderr in done.stderr


def test_a_forked_module_runs_as_main_and_a_command_past_its_time_is_killed(tmp_path):
    (tmp_path / "hello.py").write_text("import sys\nif __name__ == '__main__':\n    print('main', sys.argv[1:])\n")
    done = run_python(["-m", "hello", "x"], cwd=tmp_path, env=dict(os.environ), timeout=120)
    assert (done.returncode, done.stdout) == (0, "main ['x']\n"), done.stderr
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    assert run_python([str(script), "sleep"], cwd=tmp_path, env=dict(os.environ), timeout=2).returncode == -9
    assert sys.modules.get("hello") is None  # the command ran in the child only


SESSION_SCRIPT = """
import os, sys, time
print(os.getsid(0), flush=True)
print("err", file=sys.stderr)
time.sleep(60)
"""


def test_a_started_command_runs_in_a_session_of_its_own_and_is_watched_as_popen_watches_one(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SESSION_SCRIPT)
    started = start_python([str(script)], cwd=tmp_path, env=dict(os.environ), new_session=True, merge_stderr=True)
    with pytest.raises(subprocess.TimeoutExpired):
        started.communicate(timeout=3)
    assert started.poll() is None
    os.killpg(started.pid, signal.SIGKILL)  # the session is the command's: the test process lives on
    assert started.wait(timeout=30) == -9 and started.returncode == -9
    out, err = started.communicate()
    assert out.decode().split() == [str(started.pid), "err"] and err == b""  # its own session; the streams as one
