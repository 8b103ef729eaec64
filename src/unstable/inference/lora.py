"""Batched LoRA for the embedded engine: every resident adapter applied to its own rows in one pass per layer.

PEFT's mixed-adapter forward runs one sub-batch per adapter in every LoRA layer (and finds each adapter's rows with
a Python loop over the batch). Here each targeted linear layer holds the resident adapters' weights stacked into
slots, `A` (slots, rank, in) and `B` (slots, rank, out); a forward multiplies the input by every slot's `A` at
once, keeps each row's own slot (a per-row weight that is the adapter's scale on its slot's columns and 0 elsewhere,
so rows on the base model get nothing) and multiplies by every slot's `B`: two matmuls whatever the mix of
adapters, with no per-row copy of any adapter. The per-row weights live in one buffer that `select` overwrites in
place, so a captured CUDA graph (`slot_cache.py`) sees each step's rows; `version` changes whenever a tensor a
forward reads is replaced (a graph captured before must be captured again). Adapters are PEFT LoRA directories
(`adapter_config.json` + `adapter_model.safetensors`) on linear layers; ranks may differ (smaller ones are
zero-padded).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

PEFT_PREFIX = "base_model.model."
MIN_SLOTS = 2  # adapter slots allocated at least: a compiler takes a size of 1 as a constant (a second compile)
BASE_WEIGHT = ".base_layer.weight"


class BatchedLoRALinear(torch.nn.Module):
    """A linear layer plus the LoRA slots of `slots`; row `i` of the input uses the adapter `slots` selected for it."""

    def __init__(self, base: torch.nn.Linear, slots: LoRASlots):
        super().__init__()
        self.base = base
        self.slots = slots
        self.A = base.weight.new_zeros(0, 0, base.in_features)  # (slots, rank, in)
        self.B = base.weight.new_zeros(0, 0, base.out_features)  # (slots, rank, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        delta = self.delta(x)
        return y if delta is None else y + delta

    def delta(self, x: torch.Tensor) -> torch.Tensor | None:
        """What the rows' adapters add to the base layer's output for `x` (B, T, in); None before any adapter."""
        weights = self.slots.row_weights  # (rows, 1, slots * rank): each row's scale on its own slot's columns
        if weights is None or self.A.numel() == 0:
            return None
        down = x @ self.A.view(-1, self.A.shape[-1]).T  # (B, T, slots * rank): every slot's A at once
        return (down * weights[: x.shape[0]]) @ self.B.view(-1, self.B.shape[-1])  # (B, T, out)

    def resize(self, slots: int, rank: int) -> None:
        """Grow the stacked weights to `slots` x `rank` (zeros where new)."""
        self.A = _grown(self.A, (slots, rank, self.A.shape[2]))
        self.B = _grown(self.B, (slots, rank, self.B.shape[2]))

    def put(self, slot: int, a: torch.Tensor | None, b: torch.Tensor | None) -> None:
        """Write one adapter's `a` (r, in) and `b` (out, r) into `slot` in place (None: zeros)."""
        self.A[slot].zero_()
        self.B[slot].zero_()
        if a is not None:
            self.A[slot, : a.shape[0]] = a.to(self.A)
            self.B[slot, : b.shape[1]] = b.T.to(self.B)


class LoRASlots:
    """The resident adapters of one model: which slot each uses, its scale, and the per-row weights of the next
    forward."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.layers: dict[str, BatchedLoRALinear] = {}  # module path -> its wrapper
        self.slot_of: dict[str, int] = {}  # adapter uid -> slot
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.scale = torch.zeros(0, dtype=torch.float32)  # (slots,) each slot's adapter scale, on the CPU
        self.rank = 0  # columns per slot: the largest rank loaded
        self.row_weights: torch.Tensor | None = None  # (row_capacity, 1, slots * rank); None: no adapter yet
        self.row_capacity = 1  # rows a forward may have
        self.version = 0  # changes whenever a tensor a forward reads is replaced
        self._selected: tuple[str | None, ...] | None = None  # the rows `row_weights` holds

    def load(self, uid: str, path: str | Path) -> None:
        """Read a PEFT LoRA adapter directory into a free slot under `uid`."""
        from safetensors.torch import load_file

        config = json.loads((Path(path) / "adapter_config.json").read_text())
        self.load_tensors(uid, config, load_file(str(Path(path) / "adapter_model.safetensors")), path)

    def load_tensors(self, uid: str, config: dict, weights: dict[str, torch.Tensor], source="in memory") -> None:
        """Put an adapter given as PEFT's saved `config` and tensors (`adapter_model.safetensors`' names) into a
        free slot under `uid`; `source` names it in errors."""
        _check_supported(config, source)
        self._check_saved_base_weights(weights, source)
        pairs = _lora_pairs({k: v for k, v in weights.items() if not k.endswith(BASE_WEIGHT)}, source)
        slot = next(s for s in range(len(self.slot_of) + 1) if s not in self.slot_of.values())
        for module_path in pairs:
            if module_path not in self.layers:
                self.layers[module_path] = self._wrap(module_path)
        self._resize(max(len(self.scale), slot + 1, MIN_SLOTS), max(self.rank, config["r"]))
        for module_path, layer in self.layers.items():
            layer.put(slot, *pairs.get(module_path, (None, None)))
        self.scale[slot] = config["lora_alpha"] / (config["r"] ** 0.5 if config.get("use_rslora") else config["r"])
        self.slot_of[uid] = slot
        self._selected = None

    def unload(self, uid: str) -> None:
        """Free `uid`'s slot (its weights are zeroed; the slot is reused by the next load)."""
        slot = self.slot_of.pop(uid)
        for layer in self.layers.values():
            layer.put(slot, None, None)
        self.scale[slot] = 0.0
        self._selected = None

    def select(self, adapters: list[str | None]) -> None:
        """Set the adapter of every row of the next forward (None: the base model), in place."""
        self.reserve(len(adapters))
        if not self.layers or tuple(adapters) == self._selected:
            return
        slots = torch.tensor([self.slot_of[a] if a else -1 for a in adapters])  # (B,), -1: the base model
        on_slot = torch.nn.functional.one_hot(slots + 1, len(self.scale) + 1)[:, 1:] * self.scale  # (B, slots)
        weights = on_slot.repeat_interleave(self.rank, dim=1)[:, None]  # (B, 1, slots * rank)
        self.row_weights[: len(adapters)] = weights.to(self.row_weights)
        self._selected = tuple(adapters)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a forward reads besides the base model's: each layer's stacked `A` and `B`, the per-row
        weights."""
        stacked = [t for layer in self.layers.values() for t in (layer.A, layer.B)]
        return stacked + ([self.row_weights] if self.row_weights is not None else [])

    def reserve(self, rows: int) -> None:
        """Room in the per-row weights for forwards of `rows` rows (a captured step's padded batch included)."""
        if rows > self.row_capacity:
            self.row_capacity = max(rows, 2 * self.row_capacity)
            self._resize(len(self.scale), self.rank)

    def _resize(self, slots: int, rank: int) -> None:
        """Grow every layer's stacked weights to `slots` x `rank` and the per-row weights to `row_capacity` rows."""
        shape = (self.row_capacity, 1, slots * rank)
        if self.row_weights is not None and self.row_weights.shape == shape:
            return
        if (slots, rank) != (len(self.scale), self.rank):
            for layer in self.layers.values():
                layer.resize(slots, rank)
            self.scale = _grown(self.scale, (slots,))
            self.rank = rank
            self._selected = None  # every slot's columns moved
        if self.layers:  # more rows only: the selected rows keep their weights (a prefill reserves after `select`)
            if self.row_weights is not None and self._selected is not None:
                self.row_weights = _grown(self.row_weights, shape)
            else:
                self.row_weights = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.version += 1

    def _check_saved_base_weights(self, weights: dict[str, torch.Tensor], path) -> None:
        """PEFT also saves the base weight of a targeted layer tied to the embeddings (`lm_head`); the engine
        serves such an adapter only if that weight is the model's own (LoRA training leaves it unchanged)."""
        for key in (k for k in weights if k.endswith(BASE_WEIGHT)):
            module_path = key.removeprefix(PEFT_PREFIX).removesuffix(BASE_WEIGHT)
            module = self.model.get_submodule(module_path)
            own = module.base.weight if isinstance(module, BatchedLoRALinear) else module.weight
            if not torch.equal(weights[key].to(own), own):
                raise NotImplementedError(f"adapter {path}: it changes the base weight of {module_path}")

    def _wrap(self, module_path: str) -> BatchedLoRALinear:
        parent_path, _, name = module_path.rpartition(".")
        parent = self.model.get_submodule(parent_path) if parent_path else self.model
        base = getattr(parent, name)
        if not isinstance(base, torch.nn.Linear):
            raise NotImplementedError(f"LoRA on {module_path} ({type(base).__name__}): only linear layers are served")
        wrapper = BatchedLoRALinear(base, self)
        wrapper.resize(len(self.scale), self.rank)
        setattr(parent, name, wrapper)
        self.version += 1
        return wrapper


def adapter_rank(path: str | Path) -> int:
    """The largest rank of a PEFT LoRA adapter directory: its `r`, or a larger one in its `rank_pattern`."""
    config = json.loads((Path(path) / "adapter_config.json").read_text())
    return max([config["r"], *(config.get("rank_pattern") or {}).values()])


def _lora_pairs(weights: dict[str, torch.Tensor], path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """`module path -> (A (r, in), B (out, r))` from a PEFT adapter's tensors."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        module, _, kind = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")
        if kind not in ("A.weight", "B.weight"):
            raise NotImplementedError(f"adapter {path}: tensor {key!r} is not a LoRA A/B weight of a linear layer")
        pairs.setdefault(module, {})[kind[0]] = tensor
    return {module: (ab["A"], ab["B"]) for module, ab in pairs.items()}


def _check_supported(config: dict, path) -> None:
    """Refuse adapter variants the batched path does not compute (DoRA, LoRA biases, extra saved modules)."""
    if config.get("peft_type", "LORA") != "LORA":
        raise NotImplementedError(f"adapter {path}: peft_type {config.get('peft_type')!r}; only LORA is served")
    for option in ("use_dora", "lora_bias", "modules_to_save", "rank_pattern", "alpha_pattern", "fan_in_fan_out"):
        if config.get(option):
            raise NotImplementedError(f"adapter {path}: {option} = {config[option]!r} is not served by this engine")


def _grown(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """`tensor` zero-padded at the end of each dimension up to `shape`."""
    grown = tensor.new_zeros(shape)
    grown[tuple(slice(0, n) for n in tensor.shape)] = tensor
    return grown
