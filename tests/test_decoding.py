"""Continuous batching: rows that join a running batch mid-generation, with other prompt lengths and other LoRA
adapters, get exactly the tokens' log-probs a plain forward pass over their whole sequence gives."""

import math
import threading

import pytest
import torch

from unstable.games import get_template
from unstable.inference import InferenceConfig, InferenceServer, SamplingConfig
from unstable.inference.decoding import Row, row_key, sample_tokens
from unstable.inference.transformers_backend import TransformersBackend
from unstable.records import Checkpoint, GenerationRequest

TEMPLATE = get_template("qwen3-zs")
SHORT = TEMPLATE.render("Available Moves: '[0]'")
LONG = TEMPLATE.render("Current Board:\n 0 | 1 | 2 \n 3 | 4 | 5 \nAvailable Moves: '[0]', '[1]', '[2]', '[5]'")


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory) -> Checkpoint:
    """A LoRA adapter with non-zero weights, so its rows differ from the base model's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("adapter")
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    model.save_pretrained(path)
    return Checkpoint("lora-1", str(path))


def recomputed_logprobs(model_dir: str, row: Row, adapter: Checkpoint | None, temperature: float) -> list[float]:
    """log softmax(logits / temperature)[token] of each generated token, from one forward pass of the model (with
    the adapter applied by PEFT itself, independently of the engine's batched LoRA)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter.path)
    ids = torch.tensor([row.prompt + row.tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(row.prompt) - 1 : -1] / temperature  # (T, V)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(row.tokens)[:, None]).squeeze(-1).tolist()


def test_rows_joining_mid_generation_keep_exact_logprobs(tiny_model_dir, adapter):
    backend = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=10, temperature=0.8))
    backend.load_adapter(adapter)
    tokenize = lambda text: backend.tokenizer(text, add_special_tokens=False)["input_ids"]
    batch = backend.new_batch()
    finished = batch.add([Row("a", tokenize(LONG), None)])
    for _ in range(3):
        finished += batch.step()
    # two rows join a batch whose cache is 3 tokens into another row's completion: a shorter prompt and an adapter
    finished += batch.add([Row("b", tokenize(SHORT), adapter.uid), Row("c", tokenize(LONG), None)])
    assert len(batch) + len(finished) == 3 and batch.adapters_in_use() <= {adapter.uid}
    while len(batch):
        finished += batch.step()
    assert sorted(row.tag for row in finished) == ["a", "b", "c"]
    for row in finished:
        assert len(row.tokens) == len(row.logprobs) and row.finish_reason in ("stop", "length")
        expected = recomputed_logprobs(tiny_model_dir, row, adapter if row.adapter else None, 0.8)
        assert row.logprobs == pytest.approx(expected, abs=1e-4), row.tag
    assert len(batch.cache) == 0  # every row left, and the cache with them


def test_a_finished_rows_slot_goes_to_a_waiting_request(tiny_model_dir):
    """With room for two rows, the third request starts as soon as one of the first two finishes: the forward
    passes that ran never hold more than two rows, and all three complete."""
    backend = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=6))
    server = InferenceServer(lambda: backend, InferenceConfig(max_batch_size=2, batch_wait_ms=50))
    server.start()
    results = [None] * 3
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, server.generate(GenerationRequest(SHORT))))
        for i in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = server.stats()
    server.stop()
    assert all(r.completion_token_ids for r in results)
    assert 1 < stats["inference/mean_batch_size"] <= 2


def test_greedy_continuous_batching_matches_one_row_at_a_time(tiny_model_dir):
    backend = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=8, temperature=0.0))
    requests = [GenerationRequest(p) for p in (SHORT, LONG, SHORT + " ", LONG)]
    together = backend.generate(requests)
    alone = [backend.generate([r])[0] for r in requests]
    assert [r.completion_token_ids for r in together] == [r.completion_token_ids for r in alone]
    for a, b in zip(together, alone):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_top_p_sampling_never_picks_outside_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)  # (N, V)
    tokens, logprobs = sample_tokens(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    assert set(tokens.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.7; 0.15 and 0.05 are cut
    assert logprobs[tokens == 1][0].item() == pytest.approx(math.log(0.3 / 0.8), abs=1e-5)  # renormalised


def test_a_keyed_row_draws_the_same_token_whatever_rows_run_beside_it():
    logits = torch.randn(6, 50)
    keys = [row_key(7, 0), row_key(7, 1), None, row_key(8, 0), row_key(9, 3), None]
    sampling = SamplingConfig(temperature=1.0)
    alone = [sample_tokens(logits[i : i + 1], sampling, row_keys=[k])[0].item() for i, k in enumerate(keys) if k]
    together = sample_tokens(logits, sampling, row_keys=keys)[0]
    shuffled = sample_tokens(logits.flip(0), sampling, row_keys=keys[::-1])[0].flip(0)
    keyed = [i for i, k in enumerate(keys) if k]
    assert together[keyed].tolist() == alone == shuffled[keyed].tolist()


def test_keyed_rows_draw_nothing_from_the_engines_generator():
    """The unseeded rows' generator moves only for the unseeded rows: a batch of keyed rows leaves it as it was, and
    the unseeded rows beside keyed ones draw as they would alone."""
    logits = torch.randn(4, 50)
    generator = torch.Generator().manual_seed(0)
    before = generator.get_state()
    sample_tokens(logits, SamplingConfig(temperature=1.0), generator, row_keys=[row_key(1, 0)] * 4)
    assert torch.equal(generator.get_state(), before)
    alone = sample_tokens(logits[1:3], SamplingConfig(temperature=1.0), torch.Generator().manual_seed(5))[0]
    mixed = sample_tokens(
        logits, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(5), [row_key(2, 0), None, None, 7]
    )[0]
    assert mixed[1:3].tolist() == alone.tolist()


def test_keyed_draws_follow_the_tempered_nucleus_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(20000, 1)  # (N, V)
    keys = [row_key(seed, 0) for seed in range(20000)]
    tokens, logprobs = sample_tokens(logits, SamplingConfig(temperature=1.0), row_keys=keys)
    shares = torch.bincount(tokens, minlength=4) / 20000
    assert shares.tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05], abs=0.012)  # 3.5 binomial sd at 20,000
    cut, _ = sample_tokens(logits, SamplingConfig(temperature=1.0, top_p=0.7), row_keys=keys)
    assert set(cut.tolist()) == {0, 1}


def test_a_seeded_request_gets_the_same_completion_alone_and_among_others(tiny_model_dir):
    inference = InferenceConfig(max_new_tokens=12, temperature=1.0)
    server = InferenceServer(lambda: TransformersBackend(tiny_model_dir, inference.sampling), inference)
    server.start()
    try:
        seeded = GenerationRequest(LONG, seed=5)
        alone = server.generate(seeded).completion_token_ids
        crowd = [server.submit(GenerationRequest(SHORT if i % 2 else LONG)) for i in range(6)]
        again = server.submit(seeded).result().completion_token_ids
        assert alone == again and all(f.result() for f in crowd)
        assert {tuple(server.generate(GenerationRequest(LONG, seed=s)).completion_token_ids) for s in range(6)} != {
            tuple(alone)
        }  # another seed, another draw
    finally:
        server.stop()


def test_prefix_cache_serves_shared_prompt_blocks_with_exact_logprobs(tiny_model_dir, adapter):
    """Turns of one game share the rules' blocks: the second request prefills only what follows its cached
    prefix, per adapter, and its log-probs still equal a full forward pass; without the cache, greedy tokens
    are the same."""
    from unstable.inference.prefix_cache import BLOCK

    sampling = SamplingConfig(max_new_tokens=6, temperature=0.0)
    cached = TransformersBackend(tiny_model_dir, sampling, prefix_cache_tokens=4096)
    plain = TransformersBackend(tiny_model_dir, sampling, prefix_cache_tokens=0)
    for backend in (cached, plain):
        backend.load_adapter(adapter)
    turns = [LONG, LONG.replace("'[5]'", "'[6]'"), SHORT]
    requests = [GenerationRequest(p, c) for p in turns for c in (None, adapter)]
    first = cached.generate(requests[:2])
    assert cached.prefix_cache.hit_tokens == 0 and cached.prefix_cache.blocks
    later = cached.generate(requests[2:])  # the second turn shares every block before the changed move
    assert cached.prefix_cache.hit_tokens >= 2 * BLOCK
    assert {key[0] for key in cached.prefix_cache.blocks} == {None, adapter.uid}  # blocks are per adapter
    reference = plain.generate(requests)
    for result, expected in zip(first + later, reference):
        assert result.completion_token_ids == expected.completion_token_ids
        assert result.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    cached.unload_adapter(adapter.uid)
    assert {key[0] for key in cached.prefix_cache.blocks} == {None}


def test_a_cached_block_is_one_copy_of_every_layers_keys_and_values():
    """The prefix cache keeps a block as one tensor `(layers, 2, heads, BLOCK, head_dim)`, copied at once from the
    prefill's keys and values: one copy (one kernel on a GPU) a block instead of two a layer, 56 for a 28-layer
    model."""
    from unstable.inference.prefix_cache import BLOCK, PrefixCache

    generator = torch.Generator().manual_seed(0)
    kv = [tuple(torch.randn(2, 2 * BLOCK + 5, 4, generator=generator) for _ in range(2)) for _ in range(3)]
    cache = PrefixCache(max_tokens=4 * BLOCK)
    prompt = list(range(2 * BLOCK + 5))
    cache.store(prompt, None, 0, kv)
    blocks = [cache.blocks[(None, tuple(prompt[: (b + 1) * BLOCK]))] for b in range(2)]
    for b, block in enumerate(blocks):
        columns = slice(b * BLOCK, (b + 1) * BLOCK)
        assert block.shape == (3, 2, 2, BLOCK, 4)
        assert all(torch.equal(block[layer, 0], k[:, columns]) for layer, (k, _) in enumerate(kv))
        assert all(torch.equal(block[layer, 1], v[:, columns]) for layer, (_, v) in enumerate(kv))
    kv[0][0].zero_()  # a copy: the prefill's tensors are reused
    assert blocks[0][0, 0].abs().sum() > 0


def test_batched_lora_equals_peft_for_every_row_of_a_mixed_batch(tiny_model_dir, tmp_path):
    """Two adapters of different ranks and targets (one on the tied output layer, one with rsLoRA scaling) and base
    rows in one forward: each row's logits equal PEFT's for its own adapter; unloading frees the slot."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    shapes = {"x": dict(r=2, target_modules=["q_proj", "lm_head"]), "y": dict(r=8, target_modules=["down_proj"])}
    for name, shape in shapes.items():
        torch.manual_seed(len(name))
        peft = get_peft_model(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            LoraConfig(**shape, lora_alpha=4, use_rslora=name == "y", init_lora_weights=False),
        )
        peft.save_pretrained(tmp_path / name)
    backend = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=2))
    for name in shapes:
        backend.load_adapter(Checkpoint(name, str(tmp_path / name)))
    ids = torch.tensor([backend.tokenizer(LONG, add_special_tokens=False)["input_ids"]] * 3)
    backend.lora.select(["x", None, "y"])
    with torch.no_grad():
        batched = backend.model(ids).logits  # (3, L, V)
        for row, name in enumerate(["x", None, "y"]):
            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
            if name:
                model = PeftModel.from_pretrained(model, str(tmp_path / name))
            torch.testing.assert_close(batched[row], model(ids[:1]).logits[0], atol=1e-4, rtol=1e-4)
    backend.unload_adapter("x")
    assert backend.lora.slot_of == {"y": 1} and backend.lora.scale[0] == 0


def test_the_engines_forward_passes_keep_attention_off_cudnn(tiny_model_dir):
    """cuDNN's attention builds a plan per new shape and every decode step has one: on an H100 it made decode steps
    2-3x slower (docs/hardware.md, "One GPU"), so prefill and decode run without it."""
    backend = TransformersBackend(tiny_model_dir, SamplingConfig(max_new_tokens=4))
    seen = []  # the embedding runs first in every forward pass, the model's own (prefill) or the engine's (decode)
    embedding = backend.model.get_input_embeddings()
    embedding.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    backend.generate([GenerationRequest(SHORT), GenerationRequest(LONG)])
    assert len(seen) > 1 and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # only while the engine's forward runs
