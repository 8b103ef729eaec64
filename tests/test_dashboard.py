"""The live dashboard: every panel from a recorded run, and a real run watched under tmux."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from unstable.dashboard import panels, render
from unstable.dashboard.panels import sparkline
from unstable.dashboard.system import Gauge, system_gauges
from unstable.tracking import keys
from unstable.tracking.history import RowFollower, read_rows

RECORDED_RUN = Path(__file__).parent / "fixtures" / "recorded_run"
PANELS = (
    "throughput",
    "games (rolling window)",
    "learner",
    "rating ladder",
    "match heatmap",
    "buffer and staleness",
    "evaluation",
    "system (this machine)",
)


def _frame(run_dir, rows, width=160, height=60) -> str:
    console = Console(width=width, height=height, record=True, file=open(os.devnull, "w"))
    console.print(render(run_dir, rows, [Gauge("GPU 0 util", 42.0), Gauge("GPU 0 mem", 10.0, "8.0 / 80.0 GiB")]))
    return console.export_text()


def test_a_recorded_run_renders_every_panel_with_its_numbers():
    rows = read_rows(RECORDED_RUN)
    frame = _frame(RECORDED_RUN, rows)
    for title in PANELS:
        assert title in frame, title
    last, final = [row for row in rows if keys.STEP in row][-1], rows[-1]  # the final row has no learner step
    assert f"learner step {last[keys.STEP]}/20" in frame and "finished" in frame
    assert f"{last[keys.LOSS]:+.4f}" in frame
    assert f"{final[keys.GAMES_PER_S]:.2f}" in frame and f"{final[keys.ACTION_ENTROPY]:.2f}" in frame
    assert f"{final[keys.BUFFER_SIZE]} / {final[keys.BUFFER_CAPACITY]} steps" in frame
    assert f"{last[keys.STALENESS_MEAN]:.2f}" in frame
    assert f"[{last[keys.EVAL_WIN_LOW]:.2f}, {last[keys.EVAL_WIN_HIGH]:.2f}]  n={last[keys.EVAL_GAMES]}" in frame
    assert last[keys.POOL_LADDER][0]["agent"] in frame
    assert "tictactoe-minimax" in frame  # an eval opponent in the match heatmap
    assert "42%" in frame and "8.0 / 80.0 GiB" in frame  # the system gauges


def test_the_throughput_panel_shows_which_side_waits():
    rows = [{keys.STEP: 3, keys.WAIT_SHARE: 0.62, keys.HELD_BACK_SHARE: 0.04}]
    console = Console(width=100, record=True, file=open(os.devnull, "w"))
    console.print(panels.throughput(rows))
    frame = console.export_text()
    assert "learner wait share" in frame and "62%" in frame
    assert "collection held back" in frame and "4%" in frame


def test_the_ladder_panel_shows_games_and_dims_provisional_agents_without_odds():
    ladder = [
        {"agent": "ckpt-9", "mu": 28.0, "sigma": 0.8, "conservative": 25.6, "games": 1000, "win_probability": 0.5},
        {"agent": "ckpt-4", "mu": 37.0, "sigma": 3.0, "conservative": 28.0, "games": 8, "provisional": True},
    ]
    console = Console(width=100, record=True, file=open(os.devnull, "w"))
    console.print(panels.ladder([{keys.POOL_LADDER: ladder, keys.POOL_GAMES_RATED: 1008}]))
    plain, styled = (console.export_text(clear=False, styles=styles).splitlines() for styles in (False, True))
    ranked, provisional = (next(line for line in plain if agent in line).split()[1:] for agent in ("ckpt-9", "ckpt-4"))
    assert ranked == ["ckpt-9", "28.0", "0.8", "25.6", "1000", "0.50", "│"]
    assert provisional == ["ckpt-4", "37.0", "3.0", "28.0", "8", "-", "│"]  # no odds from 8 games
    dimmed = {agent: "\x1b[2m" in next(line for line in styled if agent in line) for agent in ("ckpt-9", "ckpt-4")}
    assert dimmed == {"ckpt-9": False, "ckpt-4": True}


def test_the_follower_returns_only_complete_new_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"learner/step": 1}\n{"learner/st')
    follower = RowFollower(tmp_path)
    assert follower.poll() == [{"learner/step": 1}]
    with open(path, "a") as f:
        f.write('ep": 2}\n')
    assert follower.poll() == [{"learner/step": 2}] and follower.poll() == []


def test_sparkline_and_system_gauges():
    assert sparkline([0, 1, 2, 3]) == "▁▃▆█" and sparkline([5, 5]) == "▁▁" and sparkline([]) == ""
    gauges = system_gauges()  # GPUs through NVML, or CPU and memory on a machine without one
    assert gauges and all(0 <= g.percent <= 100 for g in gauges)


def test_gpu_gauges_read_nvml(monkeypatch):
    """On a GPU machine the system panel shows each GPU's utilisation and memory (NVML faked here)."""
    from types import SimpleNamespace

    from unstable.dashboard.system import GIB, gpu_gauges

    fake = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetMemoryInfo=lambda handle: SimpleNamespace(used=20 * GIB, total=80 * GIB),
        nvmlDeviceGetUtilizationRates=lambda handle: SimpleNamespace(gpu=73),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_gauges() == [Gauge("GPU 0 util", 73.0), Gauge("GPU 0 mem", 25.0, "20.0 / 80.0 GiB")]


def _pane(socket: str, session: str) -> str:
    return subprocess.run(
        ["tmux", "-L", socket, "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.slow
def test_the_dashboard_follows_a_live_run_under_tmux(tmp_path, tiny_model_dir):
    """A real short training run; the dashboard in a tmux pane shows its learner step and numbers change."""
    run_dir = tmp_path / "runs" / "live"
    overrides = {
        "run.dir": tmp_path / "runs",
        "run.name": "live",
        "model.path": tiny_model_dir,
        "warm_start": "null",  # the dashboard shows rows: what the random tiny model learns does not matter here
        "learner.num_steps": 6,
        "learner.batch_size": 16,
        "learner.num_learners": 1,  # one rank: the dashboard reads the same rows
        "collector.num_workers": 8,
        "evaluation.games_at_start": 4,
        "evaluation.games_at_end": 4,
    }
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    train = subprocess.Popen(
        [sys.executable, "-m", "unstable.cli.main", "train", "examples/tictactoe-tiny.yaml", *sets, "--no-wandb"],
        cwd=Path(__file__).parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    socket, session = f"ub-test-{uuid.uuid4().hex[:8]}", "dashboard"
    try:
        while not run_dir.is_dir():
            assert train.poll() is None, "the training run ended before making its run directory"
            time.sleep(0.2)
        # the pane's own size, not COLUMNS/LINES that a non-terminal parent (pytest) may leave in the environment
        dashboard = f"env -u COLUMNS -u LINES {sys.executable} -m unstable.terminal_interface {run_dir} --interval 0.5"
        tmux = ["tmux", "-L", socket, "new-session", "-d", "-s", session, "-x", "160", "-y", "50", dashboard]
        subprocess.run(tmux, check=True)
        frames = []
        # generous bounds, not a speed check: alone the run takes under a minute, beside other work on 2 cores minutes
        deadline = time.time() + 900
        while time.time() < deadline and "finished" not in (frames or [""])[-1]:
            time.sleep(1.0)
            frames.append(_pane(socket, session))
        assert train.wait(timeout=600) == 0
        frames.append(_pane(socket, session))
    finally:
        train.kill()
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    print(frames[-1])  # the last captured pane, shown with pytest -s
    steps_shown = {
        line.split("learner step ")[1].split()[0] for f in frames for line in f.splitlines() if "learner step" in line
    }
    assert len(steps_shown) >= 2, steps_shown  # the step moved while we watched
    assert "learner step 6/6" in frames[-1] and "finished" in frames[-1]
    last_rows = read_rows(run_dir)
    final_loss = [row for row in last_rows if keys.LOSS in row][-1][keys.LOSS]
    assert f"{final_loss:+.4f}" in frames[-1]


def test_the_evaluation_panel_says_which_games_each_number_counts():
    """A run with no eval games during training: its window holds only the start evaluation, which the panel
    showed as "last 1000 games W 0.43" and a flat "win trend" above "eval end W 0.55"; now it says there were
    none during training, then the start and end evaluations; and the starting policy is named as such."""
    table = {"games": 1000, "win_rate": 0.43, "draw_rate": 0.1, "loss_rate": 0.47, "win_ci": [0.40, 0.46]}
    window = {keys.EVAL_GAMES: 1000, keys.EVAL_WIN_RATE: 0.43, keys.EVAL_WIN_LOW: 0.40, keys.EVAL_WIN_HIGH: 0.46}
    window |= {keys.EVAL_DRAW_RATE: 0.1, keys.EVAL_LOSS_RATE: 0.47, keys.TOTAL_EVAL_GAMES: 1000}
    ladder = [{"agent": "ckpt--1", "mu": 25.0, "sigma": 1.0, "conservative": 22.0, "games": 40}]
    rows = [{keys.STEP: 0, "eval_start": table} | window]
    rows += [{keys.STEP: k, keys.POOL_LADDER: ladder} | window for k in (1, 2)]
    rows += [{"final": True, "eval_start": table, "eval_end": table | {"win_rate": 0.55, "win_ci": [0.52, 0.58]}}]
    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    console.print(panels.evaluation(rows), panels.ladder(rows))
    frame = console.export_text()
    assert "last 1000" not in frame and "win trend" not in frame
    assert "no eval games" in frame and "eval start" in frame and "W 0.43" in frame and "W 0.55" in frame
    assert "start (ckpt--1)" in frame
