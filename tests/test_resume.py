"""The pieces of resume, without Ray: the state codec, atomic writes, the metrics rule, retention, the state of
the pool, the buffer and the reward transforms, and the game seeds of a resumed session."""

import json
import math
import random

import pytest
import torch

from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig, RewardStages
from unstable.collector import Collector
from unstable.collector.config import CollectorConfig
from unstable.games.moves import legal_moves
from unstable.learner.config import RetentionConfig
from unstable.pool import ModelPool
from unstable.records import EnvSpec, GameRecord, GenerationResult
from unstable.rewards import ComposeFinalRewardTransforms, RoleAdvantageByEnvFormatter
from unstable.runtime import resume
from unstable.tracking import Tracker, keys, truncate_metrics


def test_state_codec_round_trips_tensors_int_and_tuple_keys_and_rng_states(tmp_path):
    state = {
        "w": torch.randn(3, 2),
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}}, "param_groups": []},
        ("env", 1): 0.25,
        "rng": random.Random(7).getstate(),
        "nan": math.inf,
        "none": None,
    }
    resume.save_part(state, tmp_path, "part")
    loaded = resume.load_part(tmp_path, "part")
    assert torch.equal(loaded["w"], state["w"]) and loaded["optimizer"]["state"][0]["step"].item() == 3.0
    assert loaded[("env", 1)] == 0.25 and loaded["nan"] == math.inf and loaded["none"] is None
    rng = random.Random()
    rng.setstate(loaded["rng"])  # tuples come back as tuples
    assert rng.random() == random.Random(7).random()
    assert "pickle" not in (tmp_path / "part.json").read_text()


def test_a_corrupt_state_fails_in_one_line_naming_the_file(tmp_path):
    run_dir = tmp_path
    resume.save_run_state(run_dir, 1, {name: {"x": torch.ones(1)} for name in resume.PARTS})
    assert resume.latest_state(run_dir) == (1, run_dir / "state" / "step-1")
    tensors = run_dir / "state" / "step-1" / "learner.safetensors"
    tensors.write_bytes(tensors.read_bytes()[:20])  # truncated, as a full disk leaves it
    with pytest.raises(resume.ResumeError) as info:
        resume.latest_state(run_dir)
    assert "step-1/learner" in str(info.value) and "\n" not in str(info.value)


def test_a_corrupt_newest_state_falls_back_to_the_one_before_saying_so(tmp_path, caplog):
    """The previous state is kept for exactly this: a newest state cut in half (a disk that lost its last writes)
    is passed over, with a warning naming both, for the newest intact one (it was refused before)."""
    for step in (1, 2):
        resume.save_run_state(tmp_path, step, {name: {"x": torch.ones(1) * step} for name in resume.PARTS})
    tensors = tmp_path / "state" / "step-2" / "pool.safetensors"
    tensors.write_bytes(tensors.read_bytes()[: len(tensors.read_bytes()) // 2])
    assert resume.latest_state(tmp_path) == (1, tmp_path / "state" / "step-1")
    assert "step-2/pool" in caplog.text and "step 1" in caplog.text


def test_a_torn_resume_pointer_does_not_hide_the_intact_state(tmp_path):
    resume.save_run_state(tmp_path, 3, {name: {"x": torch.ones(2)} for name in resume.PARTS})
    (tmp_path / "state" / "latest.json").write_text('{"step": ')  # it was refused before
    assert resume.latest_state(tmp_path) == (3, tmp_path / "state" / "step-3")


def test_an_interrupted_state_write_leaves_the_previous_state_current(tmp_path, monkeypatch):
    resume.save_run_state(tmp_path, 1, {"learner": {"a": 1}})

    def killed(*args):
        raise KeyboardInterrupt  # stands for the kill between the temporary write and the rename

    monkeypatch.setattr(resume, "pause_for_test", killed)
    with pytest.raises(KeyboardInterrupt):
        resume.save_run_state(tmp_path, 2, {"learner": {"a": 2}})
    assert json.loads((tmp_path / "state" / "latest.json").read_text()) == {"step": 1}
    assert resume.saved_steps(tmp_path / "state", "step-") == [1]  # step-2.tmp is not a saved step


def test_metrics_keep_rows_up_to_the_saved_step_and_drop_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{keys.STEP: k} for k in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"learner/st')
    assert truncate_metrics(path, 2) == 3
    assert [json.loads(line)[keys.STEP] for line in path.read_text().splitlines()] == [0, 1, 2]
    assert truncate_metrics(path, -1) == 3 and path.read_text() == ""  # no state saved: the run starts over


def test_retention_keeps_the_last_k_every_nth_and_named_steps():
    retention = RetentionConfig(keep_last=2, keep_every=5, keep_steps=[3])
    assert [k for k in range(1, 13) if retention.keeps(k, latest=12)] == [3, 5, 10, 11, 12]
    assert [k for k in range(1, 13) if RetentionConfig().keeps(k, latest=12)] == [8, 9, 10, 11, 12]  # the newest 5


def test_prune_spares_what_keep_accepts(tmp_path):
    for k in range(1, 6):
        (tmp_path / f"ckpt-{k}").mkdir()
    (tmp_path / "ckpt-6.tmp").mkdir()
    assert resume.prune(tmp_path, "ckpt-", lambda k: k >= 4 or k == 1) == [2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-1", "ckpt-4", "ckpt-5", "ckpt-6.tmp"]


def _game(rewards, players) -> GameRecord:
    return GameRecord("TicTacToe-v0", 0, players, (), rewards, learner_player_ids=(0,))


def test_pool_state_restores_checkpoints_ratings_matches_and_sampling():
    pool = ModelPool()
    for k in (-1, 1, 2):
        pool.add_checkpoint(f"/ckpt-{k}" if k > 0 else None, iteration=k)
    pool.record_game(_game({0: 1.0, 1: -1.0}, {0: "ckpt-2", 1: "random"}))
    state = pool.state_dict()
    restored = ModelPool()
    restored.load_state_dict(state)
    assert restored.metrics() == pool.metrics()
    assert [restored.sample_opponent() for _ in range(5)] == [pool.sample_opponent() for _ in range(5)]


def test_buffer_state_carries_the_reward_baselines_and_counters():
    def buffer():
        final = ComposeFinalRewardTransforms([RoleAdvantageByEnvFormatter(0.5)])
        return StepBuffer(BufferConfig(max_buffer_size=8), stages=RewardStages(final=final))

    first = buffer()
    first.add_game(_game({0: 1.0, 1: -1.0}, {0: "a", 1: "b"}))
    second = buffer()
    second.load_state_dict(first.state_dict())
    assert second.final_transform.transforms[0].baselines == first.final_transform.transforms[0].baselines
    assert second.metrics() == first.metrics()


def test_tracker_state_continues_totals_and_time(tmp_path):
    tracker = Tracker(tmp_path)
    tracker.totals[keys.TOTAL_TRAIN_GAMES] = 7
    state = tracker.state_dict()
    resumed = Tracker(tmp_path)
    resumed.load_state_dict(state | {"elapsed": 100.0})
    assert resumed.log({})[keys.TOTAL_TRAIN_GAMES] == 7 and resumed.latest()[keys.TIME] >= 100.0


class _FirstMove:
    """An inference stand-in that always plays the first legal TicTacToe move."""

    def generate(self, request):
        return GenerationResult(f"\\boxed{{{legal_moves(request.prompt)[0]}}}", (1,), (2,), (-0.1,))

    def end_game(self, game):
        pass


def _game_seeds(tmp_path, resume_step: int, games: int = 3) -> set[int]:
    pool = ModelPool()
    pool.add_checkpoint(path=None, iteration=-1)
    cfg = CollectorConfig(training_envs=[EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")])
    buffer = StepBuffer(BufferConfig(max_buffer_size=64))
    collector = Collector(_FirstMove(), pool, buffer, Tracker(tmp_path), cfg, seed=5, resume_step=resume_step)
    return {collector.play_one(is_eval=False).seed for _ in range(games)}


def test_a_resumed_collector_plays_none_of_the_game_seeds_of_earlier_sessions(tmp_path):
    fresh, resumed_at_2, resumed_at_3 = (_game_seeds(tmp_path, step) for step in (0, 2, 3))
    assert len(fresh | resumed_at_2 | resumed_at_3) == 9  # each session's game counter starts at 0 again
