"""Decoding over preallocated KV slots (`inference/slot_cache.py`) gives the padded dynamic cache's tokens and
log-probs: eagerly on the exact batch, at bucketed static shapes (the CUDA-graph path, run uncaptured on the CPU) and
compiled, with rows joining and leaving, mixed LoRA adapters and prefix-cache hits."""

import pytest
import torch

from unstable.games import get_template
from unstable.inference import SamplingConfig
from unstable.inference.decoding import Row
from unstable.inference.slot_cache import batch_bucket, length_bucket, supports_slot_decoding
from unstable.inference.transformers_backend import TransformersBackend
from unstable.records import Checkpoint, GenerationRequest

TEMPLATE = get_template("qwen3-zs")
BOARDS = [
    "Available Moves: '[0]'",
    "Current Board:\n 0 | 1 | 2 \n 3 | 4 | 5 \nAvailable Moves: '[0]', '[1]', '[2]', '[5]'",
    "Current Board:\n X | 1 | O \nAvailable Moves: '[1]', '[3]'",
    "Current Board:\n X | O | X \n O | X | 5 \n 6 | 7 | O \nAvailable Moves: '[5]', '[6]', '[7]'",
]
PROMPTS = [TEMPLATE.render(board) for board in BOARDS]


@pytest.fixture(scope="module")
def adapter(tiny_model_dir, tmp_path_factory) -> Checkpoint:
    """A LoRA adapter with non-zero weights on every linear layer of the decoder."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("adapter")
    torch.manual_seed(3)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, target_modules=targets, init_lora_weights=False),
    )
    model.save_pretrained(path)
    return Checkpoint("lora-1", str(path))


def run_schedule(backend: TransformersBackend, adapter: Checkpoint) -> dict[str, Row]:
    """Rows joining a running batch at different steps, on the base model and on the adapter, some sharing prompt
    prefixes with earlier rows (prefix-cache hits); every row run to its end. Returns the finished rows by tag."""
    backend.load_adapter(adapter)
    backend.generator.manual_seed(0)
    tokenize = lambda text: backend.tokenizer(text, add_special_tokens=False)["input_ids"]
    batch = backend.new_batch()
    joins = {0: [0, 1], 2: [2], 3: [1, 3, 0], 7: [2, 1]}  # step -> prompts joining then
    finished, step = [], 0
    while step <= max(joins) or len(batch):
        if step in joins:
            rows = [
                Row(f"{step}-{i}", tokenize(PROMPTS[p]), adapter.uid if i % 2 else None)
                for i, p in enumerate(joins[step])
            ]
            finished += batch.add(rows)
        finished += batch.step()
        step += 1
    return {row.tag: row for row in finished}


@pytest.mark.parametrize("mode", ["eager", "cuda_graphs", "compiled"])
def test_slot_cache_gives_the_padded_caches_greedy_tokens_and_logprobs(tiny_model_dir, adapter, mode, monkeypatch):
    """Compiled: through dynamo and AOT autograd (`aot_eager`), the decode step and the prefills (one-row ones padded
    to two rows) as compiled layers."""
    if mode == "compiled":
        compile_with_aot_eager(monkeypatch)
    greedy = SamplingConfig(12, 0.0)
    padded = TransformersBackend(tiny_model_dir, greedy, slot_cache=False)
    slots = TransformersBackend(tiny_model_dir, greedy, cuda_graphs=mode != "eager", compile=mode == "compiled")
    assert slots.slot_cache and not padded.slot_cache
    expected, got = run_schedule(padded, adapter), run_schedule(slots, adapter)
    assert sorted(got) == sorted(expected) and len(got) == 8
    for tag, row in expected.items():
        assert got[tag].tokens == row.tokens, tag
        assert got[tag].logprobs == pytest.approx(row.logprobs, abs=1e-5), tag
        assert got[tag].cached == row.cached
    assert sum(row.cached for row in got.values()) > 0  # some rows took their prefix from the prefix cache
    torch._dynamo.reset()


def compile_with_aot_eager(monkeypatch) -> None:
    """The slot cache's `torch.compile` with the aot_eager backend: dynamo's and AOT autograd's graphs and guards,
    not inductor's code (which takes a minute to compile on the CPU)."""
    from unstable.inference import slot_cache

    compile = torch.compile
    monkeypatch.setattr(slot_cache.torch, "compile", lambda fn, **options: compile(fn, backend="aot_eager", **options))
    torch._dynamo.reset()


def test_sampled_rows_log_probs_equal_a_full_forward_pass(tiny_model_dir, adapter):
    """Sampled at temperature 0.8 over slots at bucketed shapes (rows move between slots as others leave, so the
    random draws reach other rows than on the padded cache): each token's log-prob is a whole-sequence forward's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backend = TransformersBackend(tiny_model_dir, SamplingConfig(12, 0.8), cuda_graphs=True)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    models = {
        None: base,
        adapter.uid: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter.path),
    }
    for row in run_schedule(backend, adapter).values():
        with torch.no_grad():
            logits = models[row.adapter](torch.tensor([row.prompt + row.tokens])).logits[0, len(row.prompt) - 1 : -1]
        expected = torch.log_softmax(logits / 0.8, -1).gather(-1, torch.tensor(row.tokens)[:, None]).squeeze(-1)
        assert row.logprobs == pytest.approx(expected.tolist(), abs=1e-4), row.tag


def test_bucketed_steps_pad_with_free_slots_and_move_rows_into_freed_ones(tiny_model_dir):
    """At bucketed shapes a step of 3 rows runs 4 (the fourth a free slot at position 0); when the first row leaves,
    the last row moves into its slot and decodes on as it would alone."""
    greedy = SamplingConfig(10, 0.0)
    backend = TransformersBackend(tiny_model_dir, greedy, cuda_graphs=True)
    tokenize = lambda text: backend.tokenizer(text, add_special_tokens=False)["input_ids"]
    batch = backend.new_batch()
    batch.add([Row(i, tokenize(p), None) for i, p in enumerate(PROMPTS[:3])])
    batch.step()
    longest = max(len(row.prompt) for row in batch.rows)
    assert batch.cache.keys[0].shape[0] == 4 and list(batch.cache._captured) == [(4, length_bucket(longest + 1))]
    batch.rows[0].finish_reason = "stop"
    batch._drop_finished()
    assert [row.tag for row in batch.rows] == [2, 1]  # the last row took the freed slot 0
    assert batch.cache.positions == [len(row.prompt) + 1 for row in batch.rows]  # prompt + first token cached
    moved, finished = batch.rows[0], []
    while len(batch):
        finished += batch.step()
    alone = TransformersBackend(tiny_model_dir, greedy, slot_cache=False).generate([GenerationRequest(PROMPTS[2])])
    assert moved in finished and tuple(moved.tokens) == alone[0].completion_token_ids
    assert moved.logprobs == pytest.approx(alone[0].logprobs, abs=1e-5)


def test_bucket_sizes():
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 8, 9, 17, 64, 65, 200, 257)] == [
        1,
        2,
        4,
        8,
        8,
        16,
        24,
        64,
        80,
        208,
        288,
    ]
    assert [length_bucket(n) for n in (1, 32, 33, 300)] == [32, 32, 64, 320]


def test_only_full_attention_llama_family_models_decode_over_slots(tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_dir)
    with torch.device("meta"):
        assert supports_slot_decoding(AutoModelForCausalLM.from_config(config))
        config.layer_types = ["sliding_attention"] * config.num_hidden_layers
        assert not supports_slot_decoding(AutoModelForCausalLM.from_config(config))


def test_a_padded_step_has_lora_weights_for_its_padding_rows(tiny_model_dir, adapter):
    """5 rows on an adapter run as a bucket of 8: the per-row LoRA weights have room for all 8 (they had 5, and the
    step failed on mismatched shapes)."""
    greedy = SamplingConfig(4, 0.0)
    backend = TransformersBackend(tiny_model_dir, greedy, cuda_graphs=True)
    backend.load_adapter(adapter)
    requests = [GenerationRequest(PROMPTS[i % 4], adapter if i % 2 else None) for i in range(5)]
    padded = TransformersBackend(tiny_model_dir, greedy, slot_cache=False)
    padded.load_adapter(adapter)
    for got, expected in zip(backend.generate(requests), padded.generate(requests)):
        assert got.completion_token_ids == expected.completion_token_ids
        assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)


def test_the_compiled_layer_is_compiled_once_per_lora_state_and_pass_whatever_the_batch_and_length(
    tiny_model_dir, adapter, monkeypatch
):
    """The loop's engine meets every batch bucket and context length, the cache growing, adapters arriving and a
    second adapter widening the LoRA slots: its compiled layer is traced once without adapters and once with them,
    for the decode step (one token a row) and for prefills (two or more).
    (A compile takes tens of seconds on a GPU machine for a 28-layer model: the compiled loop of benchmarks/gpu.py
    had not made its 8 learner steps after 280 s.) Compiled with the aot_eager backend: dynamo's and AOT autograd's
    guards, not inductor's code."""
    from torch._dynamo.utils import counters

    compile_with_aot_eager(monkeypatch)
    counters.clear()
    backend = TransformersBackend(tiny_model_dir, SamplingConfig(40, 1.0), cuda_graphs=True, compile=True)
    tokenize = lambda text: backend.tokenizer(text, add_special_tokens=False)["input_ids"]
    batch = backend.new_batch()
    second = Checkpoint("lora-2", adapter.path)
    exact = (tokenize(PROMPTS[3]) * 4)[:216]  # + 40 new tokens: steps up to the cache's first width, 256 columns
    for rows, uid in ((1, None), (3, None), (9, None), (5, adapter.uid), (17, adapter.uid), (6, second.uid)):
        if uid and uid not in backend.adapters:
            backend.load_adapter(adapter if uid == adapter.uid else second)
        prompts = [exact] if rows == 1 else [tokenize(PROMPTS[i % 4]) * 3 for i in range(rows)]
        batch.add([Row(i, prompt, uid if i % 2 else None) for i, prompt in enumerate(prompts)])
        for _ in range(40):  # past the first 256 columns: the cache grows
            batch.step()
    assert counters["stats"]["unique_graphs"] == 4
    torch._dynamo.reset()


def test_the_compiled_step_traces_one_decoder_layer_whatever_the_depth(tiny_model_dir, tmp_path, monkeypatch):
    """The compiled layer is one decoder layer compiled once and run by every layer (here a prefill's): what dynamo
    traces does not grow with the model's depth. (The whole pass compiled took minutes for the 28-layer Qwen3-0.6B
    shape with adapters on an H200: the first LoRA checkpoint stalled the loop's engine past benchmarks/gpu.py's
    time.)"""
    from torch._dynamo.utils import counters
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    compile_with_aot_eager(monkeypatch)
    traced = {}
    for layers in (1, 2):
        config = AutoConfig.from_pretrained(tiny_model_dir, num_hidden_layers=layers)
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:1] * layers
        deeper = tmp_path / f"layers-{layers}"
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(deeper)
        AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(deeper)
        torch._dynamo.reset()
        counters.clear()
        backend = TransformersBackend(str(deeper), SamplingConfig(1, 1.0), cuda_graphs=True, compile=True)
        backend.generate([GenerationRequest(PROMPTS[0])])
        traced[layers] = counters["stats"]["calls_captured"]
    torch._dynamo.reset()
    assert traced[1] == traced[2] > 0


def test_full_weights_loaded_in_place_reach_the_fused_projections(tiny_model_dir):
    """The decode step's concatenated q/k/v and gate/up weights are the model's own parameters' storage: weights
    handed over in place (`load_weight_tensors`) are the ones the next steps decode with."""
    greedy = SamplingConfig(10, 0.0)
    slots = TransformersBackend(tiny_model_dir, greedy, cuda_graphs=True)
    padded = TransformersBackend(tiny_model_dir, greedy, slot_cache=False)
    request = [GenerationRequest(PROMPTS[1])]
    before = slots.generate(request)[0]
    generator = torch.Generator().manual_seed(0)
    state = {k: v + 0.2 * torch.randn(v.shape, generator=generator) for k, v in padded.model.state_dict().items()}
    for backend in (slots, padded):
        backend.load_weight_tensors(state)
    got, expected = slots.generate(request)[0], padded.generate(request)[0]
    assert got.completion_token_ids == expected.completion_token_ids != before.completion_token_ids
    assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
