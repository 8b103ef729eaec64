"""The model path without Ray: batched generation with log-probs, a learner update, hot-swap of adapters."""

import math
import threading
from pathlib import Path

import pytest
import torch

from unstable.agents.policy import PolicyAgent
from unstable.agents.scripted import RandomAgent
from unstable.algorithms import Reinforce
from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig
from unstable.games import get_template, play_episode
from unstable.inference import InferenceConfig, InferenceServer, SamplingConfig
from unstable.inference.transformers_backend import TransformersBackend
from unstable.learner import Learner, LearnerConfig, LoraConfig, PolicyConfig, PolicyModel
from unstable.learner.config import nest_flat_fields
from unstable.pool import ModelPool
from unstable.records import Checkpoint, EnvSpec, GenerationRequest
from unstable.runtime.loop import LearnerLoop
from unstable.tracking import Tracker, keys

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
PROMPT = get_template("qwen3-zs").render("Current Board: 0 | 1 | 2. Available Moves: '[0]', '[1]'")


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    srv = InferenceServer(
        lambda: TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=12)),
        InferenceConfig(batch_wait_ms=20, max_loras=2),
    )
    srv.start()
    yield srv
    srv.stop()


def test_concurrent_requests_are_batched_with_exact_logprobs(server, tiny_model_dir):
    results = [None] * 8

    def ask(i):
        results[i] = server.generate(GenerationRequest(PROMPT))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = server.stats()
    assert stats["inference/requests"] == 8 and stats["inference/mean_batch_size"] > 1  # rows shared forward passes
    result = results[0]
    assert 1 <= len(result.completion_token_ids) <= 12 == len(result.logprobs) or result.finish_reason == "stop"
    assert len(result.logprobs) == len(result.completion_token_ids)

    # the recorded behaviour log-probs are the model's own (temperature 1): recompute with a forward pass
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([list(result.prompt_token_ids) + list(result.completion_token_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1], -1)
    n_prompt = len(result.prompt_token_ids)
    expected = [logp[n_prompt - 1 + j, tok].item() for j, tok in enumerate(result.completion_token_ids)]
    assert result.logprobs == pytest.approx(expected, abs=1e-4)


def test_policy_agent_plays_a_full_game_against_random(server):
    agent = PolicyAgent(server, Checkpoint("ckpt--1"), get_template("qwen3-zs"))
    record = play_episode(TICTACTOE, {0: agent, 1: RandomAgent(0)}, seed=1, learner_player_ids=(0,))
    assert not record.failed
    model_steps = [s for s in record.steps if s.player_id == 0]
    assert model_steps and all(s.has_tokens and s.prompt.startswith("<|im_start|>") for s in model_steps)
    assert all(len(s.behaviour_logprobs) == len(s.completion_token_ids) for s in model_steps)


def _loop(model_dir, buffer, pool, run_dir, algorithm, **learner_settings):
    """A learner loop over plain components; the tracker reads the buffer's and the pool's metrics."""
    cfg = LearnerConfig(**nest_flat_fields(learner_settings))  # StandardLearner-style keywords
    tracker = Tracker(run_dir)
    tracker.add_source(buffer)
    tracker.add_source(pool)
    return LearnerLoop(Learner.build(model_dir, algorithm, cfg), buffer, pool, tracker, str(run_dir))


def _greedy(server_backend, checkpoint):
    return server_backend.generate([GenerationRequest(PROMPT, checkpoint)])[0].completion_token_ids


def test_learner_update_changes_the_adapter_and_the_engine_hot_swaps_it(tiny_model_dir, tmp_path):
    # collect a few real games into a buffer
    gen = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=8))
    server = InferenceServer(lambda: gen, InferenceConfig(batch_wait_ms=1, max_loras=2))
    server.start()
    pool = ModelPool()
    base = pool.add_checkpoint(None, -1)
    buffer = StepBuffer(BufferConfig(max_buffer_size=64))
    template = get_template("qwen3-zs")
    for seed in range(6):
        agents = {0: PolicyAgent(server, base, template), 1: RandomAgent(seed)}
        buffer.add_game(play_episode(TICTACTOE, agents, seed, learner_player_ids=(0,)))
    assert buffer.size() >= 6

    loop = _loop(
        tiny_model_dir, buffer, pool, tmp_path, Reinforce(max_generation_len=8),
        batch_size=6, micro_batch_tokens=256, learning_rate=0.05, lora=LoraConfig(lora_rank=4),
    )  # fmt: skip
    rows = loop.train(1)
    assert rows[0][keys.STEP] == 1 and math.isfinite(rows[0][keys.PG_LOSS])
    assert rows[0][keys.BUFFER_SIZE] == buffer.size() and rows[0][keys.POOL_CHECKPOINTS] == 2  # sources in the row
    new = pool.latest()
    assert new.uid == "ckpt-1" and (tmp_path / "checkpoints" / "ckpt-1" / "adapter_model.safetensors").exists()

    # hot swap: the very next generation that names the new checkpoint uses the new adapter
    greedy = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=8, temperature=0.0))
    before = greedy.generate([GenerationRequest(PROMPT)])[0]
    greedy.load_adapter(new)
    after, base_again = greedy.generate([GenerationRequest(PROMPT, new), GenerationRequest(PROMPT)])
    assert base_again.completion_token_ids == before.completion_token_ids
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-6)

    # and the server loads it lazily from the path the pool registered
    result = server.generate(GenerationRequest(PROMPT, new))
    assert result.completion_token_ids and "ckpt-1" in gen.adapters
    server.stop()


def test_server_evicts_least_recently_used_adapter(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    paths = []
    for i in range(3):
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False),
        )
        model.save_pretrained(tmp_path / f"a{i}")
        paths.append(Checkpoint(f"a{i}", str(tmp_path / f"a{i}")))
    backend = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=2))
    server = InferenceServer(lambda: backend, InferenceConfig(batch_wait_ms=0, max_loras=2))
    server.start()
    for ckpt in paths:
        server.generate(GenerationRequest(PROMPT, ckpt))
    assert backend.adapters == {"a1", "a2"}
    server.generate(GenerationRequest(PROMPT, paths[0]))  # evicted one comes back from its path
    assert backend.adapters == {"a2", "a0"}
    server.stop()
    assert not server._worker.is_alive()  # stop() waits for the batching thread
    with pytest.raises(RuntimeError, match="stopped"):
        server.generate(GenerationRequest(PROMPT, paths[0]))


def test_an_adapter_that_fails_to_load_fails_only_the_requests_naming_it(tiny_model_dir, tmp_path):
    """Requests admitted together, one naming an adapter whose folder is gone: it fails with the cause, the others
    are served (every request admitted with it failed before)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj"])
    )
    model.save_pretrained(tmp_path / "good")
    good, gone = Checkpoint("good", str(tmp_path / "good")), Checkpoint("gone", str(tmp_path / "deleted"))
    server = InferenceServer(
        lambda: TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=2)),
        InferenceConfig(batch_wait_ms=300, max_loras=2),
    )
    server.start()
    futures = [server.submit(GenerationRequest(PROMPT, c)) for c in (good, gone, None, good)]
    assert all(futures[i].result(timeout=60).completion_token_ids for i in (0, 2, 3))
    with pytest.raises(FileNotFoundError):
        futures[1].result(timeout=60)
    assert server.stats()["inference/batches"] >= 1 and server.generate(GenerationRequest(PROMPT, good))
    server.stop()


def _greedy_server_with_games(model_dir: str) -> tuple[ModelPool, Checkpoint, InferenceServer, StepBuffer]:
    """A pool on the base model, a greedy server of it and a buffer of 3 of its games against random."""
    pool = ModelPool()
    base = pool.add_checkpoint(None, -1)
    backend = TransformersBackend(model_dir, SamplingConfig(max_new_tokens=6, temperature=0.0))
    server = InferenceServer(lambda: backend, InferenceConfig(batch_wait_ms=0))
    server.start()
    buffer = StepBuffer(BufferConfig(max_buffer_size=32))
    for seed in range(3):
        agents = {0: PolicyAgent(server, base, get_template("qwen3-zs")), 1: RandomAgent(seed)}
        buffer.add_game(play_episode(TICTACTOE, agents, seed, learner_player_ids=(0,)))
    return pool, base, server, buffer


def test_full_finetuning_checkpoint_replaces_served_weights(tiny_model_dir, tmp_path):
    pool, base, server, buffer = _greedy_server_with_games(tiny_model_dir)
    loop = _loop(tiny_model_dir, buffer, pool, tmp_path, Reinforce(), batch_size=3, learning_rate=0.05, lora=None)
    before = server.generate(GenerationRequest(PROMPT, base))
    loop.train(1)
    new = pool.latest()
    assert new.kind == "full" and (tmp_path / "checkpoints" / "ckpt-1" / "model.safetensors").exists()
    after = server.generate(GenerationRequest(PROMPT, new))
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-6)
    stale = server.generate(GenerationRequest(PROMPT, base))  # a game started before the update
    assert (before.served_by, after.served_by, stale.served_by) == (base, new, new)  # the weights that served it
    # the same weights: equal up to float32 rounding (the second may reuse the first's cached prompt; a fresh-clone
    # make test saw 1.4e-6 apart on a log-prob of -3.6)
    assert stale.logprobs == pytest.approx(after.logprobs, abs=1e-5)
    server.stop()


@pytest.mark.parametrize("lora", [LoraConfig(lora_rank=4), None], ids=["lora", "full"])
def test_the_learner_hands_its_policy_over_in_memory_before_its_folder_is_written(tiny_model_dir, tmp_path, lora):
    """With a handover, the new policy is served from the tensors the learner offered while its checkpoint folder is
    not yet written: generations change and the served version is the learner's; the folder written afterwards holds
    the same weights (an engine loading it gives the same greedy tokens and log-probs)."""
    pool, base, server, buffer = _greedy_server_with_games(tiny_model_dir)
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    before = server.generate(GenerationRequest(PROMPT, base))
    served = {}

    def handover(checkpoint, weights):
        assert server.offer(checkpoint, weights) and not Path(checkpoint.path).exists()  # no folder yet
        served["result"] = server.generate(GenerationRequest(PROMPT, checkpoint))
        served["checkpoint"] = checkpoint
        return True

    loop = _loop(tiny_model_dir, buffer, pool, tmp_path, Reinforce(), batch_size=3, learning_rate=0.05, lora=lora)
    loop.handover = handover
    row = loop.train(1)[0]
    loop.close()
    new, result = pool.latest(), served["result"]
    assert served["checkpoint"] == new and result.served_by == new and new.version == 1
    assert result.logprobs != pytest.approx(before.logprobs, abs=1e-6)  # the new weights served it
    assert row[keys.WEIGHT_SYNC_SECONDS] > 0
    from_folder = TransformersBackend(tiny_model_dir, greedy)  # the folder, written after the handover
    if lora is None:
        from_folder.load_weights(new.path)
    else:
        from_folder.load_adapter(new)
    again = from_folder.generate([GenerationRequest(PROMPT, new if lora else None)])[0]
    assert again.completion_token_ids == result.completion_token_ids
    assert again.logprobs == pytest.approx(result.logprobs, abs=1e-5)
    server.stop()


def test_batch_naming_more_adapters_than_max_loras_is_split(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    checkpoints = []
    for i in range(3):
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj"])
        )
        model.save_pretrained(tmp_path / f"b{i}")
        checkpoints.append(Checkpoint(f"b{i}", str(tmp_path / f"b{i}")))
    server = InferenceServer(
        lambda: TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=2)),
        InferenceConfig(batch_wait_ms=300, max_loras=2),
    )
    server.start()
    futures = [server.submit(GenerationRequest(PROMPT, c)) for c in [*checkpoints, None]]
    assert all(f.result(timeout=60).completion_token_ids for f in futures)
    assert server.stats()["inference/batches"] == 2
    server.stop()


def test_behaviour_logprobs_are_the_renormalised_top_p_nucleus_they_were_sampled_from(tiny_model_dir):
    """Under top_p < 1 a token's recorded log-prob is its log-probability under the distribution it was drawn
    from: tempered, cut to the nucleus and renormalised (vLLM's processed log-probs are the same); the result says
    which temperature and top_p that was."""
    backend = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=6, temperature=0.7, top_p=0.5))
    result = backend.generate([GenerationRequest(PROMPT)])[0]
    ids = torch.tensor([list(result.prompt_token_ids) + list(result.completion_token_ids)])
    with torch.no_grad():
        logits = backend.model(ids).logits[0, len(result.prompt_token_ids) - 1 : -1] / 0.7  # (T, V)
    probs = torch.softmax(logits, -1)  # (T, V)
    truncated, untruncated = [], []
    for step, token in enumerate(result.completion_token_ids):
        ranked, order = probs[step].sort(descending=True)
        size = int((ranked.cumsum(0) - ranked < 0.5).sum())  # the smallest top set whose mass reaches 0.5
        assert token in order[:size].tolist()  # drawn from the nucleus
        truncated.append(math.log(probs[step, token] / ranked[:size].sum()))
        untruncated.append(math.log(probs[step, token]))
    assert result.logprobs == pytest.approx(truncated, abs=1e-4)
    assert result.logprobs != pytest.approx(untruncated, abs=1e-3)  # the cut removed some mass
    assert (result.temperature, result.top_p) == (0.7, 0.5)


class OneAtATime:
    """A backend as an agent's `GenerationClient`: each request is a batch of its own."""

    def __init__(self, backend):
        self.backend = backend

    def generate(self, request):
        return self.backend.generate([request])[0]


def assert_scored_as_sampled(policy, steps):
    """The policy's token log-probs of `steps` equal the recorded behaviour log-probs (on-policy ratio 1)."""
    for batch in policy.micro_batches(steps):
        with torch.no_grad():
            logprobs = policy.forward(batch).logprobs  # (b, L-1)
        completion = batch.completion_mask.bool()
        torch.testing.assert_close(logprobs[completion], batch.behaviour_logprobs[completion], atol=1e-4, rtol=0)


def test_the_learner_scores_steps_under_the_distribution_they_were_sampled_from(tiny_model_dir):
    """Steps say how they were sampled (temperature 0.7, top_p 0.5) and the learner, on the same weights, gives
    every token the log-prob the engine recorded."""
    backend = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=8, temperature=0.7, top_p=0.5))
    agent = PolicyAgent(OneAtATime(backend), Checkpoint("ckpt--1"), get_template("qwen3-zs"))
    record = play_episode(TICTACTOE, {0: agent, 1: RandomAgent(0)}, seed=1, learner_player_ids=(0,))
    steps = [s for s in record.steps if s.has_tokens]
    policy = PolicyModel(tiny_model_dir, PolicyConfig())  # LoRA starts as the base model
    policy.load()
    assert_scored_as_sampled(policy, steps)
    assert {(s.temperature, s.top_p) for s in steps} == {(0.7, 0.5)}


def test_a_learner_built_from_the_seed_keywords_scores_steps_at_their_sampling_temperature(tiny_model_dir):
    """The seed API's learner has no temperature of its own to disagree with the Collector's `vllm_config`: steps
    sampled at temperature 0.7 say so, and it scores them at 0.7 (its first update is on-policy)."""
    from unstable.runtime.original_api import learner_config_from_original_api

    backend = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=8, temperature=0.7))
    agent = PolicyAgent(OneAtATime(backend), Checkpoint("ckpt--1"), get_template("qwen3-zs"))
    record = play_episode(TICTACTOE, {0: agent, 1: RandomAgent(0)}, seed=2, learner_player_ids=(0,))
    steps = [s for s in record.steps if s.has_tokens]
    cfg = learner_config_from_original_api(batch_size=len(steps), learning_rate=1e-3, lora_cfg={"lora_rank": 4})
    learner = Learner.build(tiny_model_dir, Reinforce(), cfg)
    learner.initialize()
    metrics = learner.train_step(steps)
    assert metrics[keys.RATIO_MEAN] == pytest.approx(1.0, abs=1e-4)


def test_the_served_adapter_is_peft_s_saved_state_copied(tiny_model_dir):
    """`served_weights` of a LoRA policy finds the adapter's parameters once and copies them under the names PEFT
    saves: the same names and values as PEFT's state dict after each change, never the live parameters."""
    from peft import get_peft_model_state_dict

    policy = PolicyModel(tiny_model_dir, PolicyConfig(lora=LoraConfig(lora_rank=4)))
    policy.load()
    for _ in range(2):
        with torch.no_grad():
            for parameter in policy.trainable_parameters():
                parameter.add_(0.01)
        _, served = policy.served_weights()
        saved = get_peft_model_state_dict(policy.model)
        assert list(served) == list(saved) and len(served) > 0
        for name, tensor in saved.items():
            assert torch.equal(served[name], tensor) and served[name].data_ptr() != tensor.data_ptr()
