"""The Tracker's sinks: TensorBoard event files and an offline W&B run hold what the JSONL row holds."""

import pytest

from unstable.tracking import Tracker, TrackerConfig, keys
from unstable.tracking.sinks import TensorBoardSink, WandbSink, make_sinks, scalars

ROWS = [
    {keys.STEP: 1, keys.LOSS: 0.5, keys.GAMES_PER_S: 3.0, keys.INFERENCE_TOKENS_PER_S_BY_ACTOR: [10.0, 20.0]},
    {keys.STEP: 2, keys.LOSS: 0.25, keys.GAMES_PER_S: 4.0, keys.POOL_LADDER: [{"agent": "a", "mu": 25.0}]},
]


def test_scalars_keep_numbers_and_spread_per_actor_lists():
    row = ROWS[0] | {"final": True, keys.POOL_LADDER: [], "note": "x"}
    assert scalars(row) == {
        keys.STEP: 1.0,
        keys.LOSS: 0.5,
        keys.GAMES_PER_S: 3.0,
        f"{keys.INFERENCE_TOKENS_PER_S_BY_ACTOR}/0": 10.0,
        f"{keys.INFERENCE_TOKENS_PER_S_BY_ACTOR}/1": 20.0,
    }


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker(tmp_path, [TensorBoardSink(tmp_path)])
    written = [tracker.log(row) for row in ROWS]
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars(keys.LOSS)]
    assert loss == [(1, 0.5), (2, 0.25)]
    games = [e.value for e in events.Scalars(keys.GAMES_PER_S)]
    assert games == pytest.approx([row[keys.GAMES_PER_S] for row in written])
    actor_1 = events.Scalars(f"{keys.INFERENCE_TOKENS_PER_S_BY_ACTOR}/1")
    assert [(e.step, e.value) for e in actor_1] == [(1, 20.0)]
    assert keys.TIME in events.Tags()["scalars"]  # the tracker's own aggregates go there too


@pytest.mark.slow
def test_wandb_offline_writes_its_files_under_wandb_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "wandb-dir").mkdir()
    sinks = make_sinks(TrackerConfig(tensorboard=False, wandb="auto", wandb_project="UB"), tmp_path, "demo")
    assert [type(sink) for sink in sinks] == [WandbSink]
    tracker = Tracker(tmp_path, sinks)
    for row in ROWS:
        tracker.log(row)
    tracker.close()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    (log_file,) = run.glob("*.wandb")
    assert log_file.stat().st_size > 0


def test_sinks_follow_the_tracker_settings(tmp_path):
    assert make_sinks(TrackerConfig(tensorboard=False, wandb="disabled"), tmp_path, "r") == []
    (sink,) = make_sinks(TrackerConfig(wandb="disabled"), tmp_path, "r")
    assert isinstance(sink, TensorBoardSink)
    sink.close()
    with pytest.raises(ValueError, match="wandb"):
        TrackerConfig(wandb="sometimes")
