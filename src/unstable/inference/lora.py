"""Batched LoRA for the embedded engine: every resident adapter applied to its own rows in one pass per layer.

PEFT's mixed-adapter forward runs one sub-batch per adapter in every LoRA layer (and finds each adapter's rows with
a Python loop over the batch). Here each targeted linear layer holds the resident adapters' weights stacked into
slots, `A` (slots, rank, in) and `B` (slots, out, rank), slot 0 all zeros for rows on the base model; a forward
gathers each row's slot and adds `scale * x A^T B^T` with two batched matmuls, whatever the mix of adapters.
Adapters are PEFT LoRA directories (`adapter_config.json` + `adapter_model.safetensors`) on linear layers; ranks
may differ (smaller ones are zero-padded).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

PEFT_PREFIX = "base_model.model."
BASE_WEIGHT = ".base_layer.weight"


class BatchedLoRALinear(torch.nn.Module):
    """A linear layer plus the LoRA slots of `slots`; row `i` of the input uses slot `slots.rows[i]`."""

    def __init__(self, base: torch.nn.Linear, slots: LoRASlots):
        super().__init__()
        self.base = base
        self.slots = slots
        self.A = base.weight.new_zeros(1, 0, base.in_features)  # (slots, rank, in)
        self.B = base.weight.new_zeros(1, base.out_features, 0)  # (slots, out, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self.slots.rows
        if rows is None or self.A.shape[1] == 0:
            return y
        a, b = self.A[rows], self.B[rows]  # (B, rank, in), (B, out, rank)
        return y + self.slots.row_scale * torch.bmm(torch.bmm(x, a.transpose(1, 2)), b.transpose(1, 2))  # (B, T, out)

    def put(self, slot: int, a: torch.Tensor | None, b: torch.Tensor | None, rank: int) -> None:
        """Write one adapter's `a` (r, in) and `b` (out, r) into `slot` (None: zeros), growing to `rank`/`slot`."""
        slots, width = max(self.A.shape[0], slot + 1), max(self.A.shape[1], rank)
        if (slots, width) != tuple(self.A.shape[:2]):
            self.A = _grown(self.A, (slots, width, self.A.shape[2]))
            self.B = _grown(self.B, (slots, self.B.shape[1], width))
        self.A[slot].zero_()
        self.B[slot].zero_()
        if a is not None:
            self.A[slot, : a.shape[0]] = a.to(self.A)
            self.B[slot, :, : b.shape[1]] = b.to(self.B)


class LoRASlots:
    """The resident adapters of one model: which slot each uses, its scale, and the rows of the next forward."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.layers: dict[str, BatchedLoRALinear] = {}  # module path -> its wrapper
        self.slot_of: dict[str, int] = {}  # adapter uid -> slot (1, 2, ...; 0 is the base model)
        weight = next(model.parameters())
        self.scale = weight.new_zeros(1, dtype=torch.float32)  # (slots,), on the model's device
        self.dtype = weight.dtype
        self.rows: torch.Tensor | None = None  # (B,) slot of each row of the running forward
        self.row_scale: torch.Tensor | None = None  # (B, 1, 1) each row's adapter scale

    def load(self, uid: str, path: str | Path) -> None:
        """Read a PEFT LoRA adapter directory into a free slot under `uid`."""
        from safetensors.torch import load_file

        config = json.loads((Path(path) / "adapter_config.json").read_text())
        _check_supported(config, path)
        weights = load_file(str(Path(path) / "adapter_model.safetensors"))
        self._check_saved_base_weights(weights, path)
        pairs = _lora_pairs({k: v for k, v in weights.items() if not k.endswith(BASE_WEIGHT)}, path)
        slot = next(s for s in range(1, len(self.slot_of) + 2) if s not in self.slot_of.values())
        rank = config["r"]
        for module_path in pairs:
            if module_path not in self.layers:
                self.layers[module_path] = self._wrap(module_path)
        for module_path, layer in self.layers.items():
            a, b = pairs.get(module_path, (None, None))
            layer.put(slot, a, b, rank)
        scale = config["lora_alpha"] / (rank**0.5 if config.get("use_rslora") else rank)
        self.scale = _grown(self.scale, (max(len(self.scale), slot + 1),))
        self.scale[slot] = scale
        self.slot_of[uid] = slot

    def unload(self, uid: str) -> None:
        """Free `uid`'s slot (its weights are zeroed; the slot is reused by the next load)."""
        slot = self.slot_of.pop(uid)
        for layer in self.layers.values():
            layer.put(slot, None, None, 0)
        self.scale[slot] = 0.0

    def select(self, adapters: list[str | None], device: str) -> None:
        """Set the slot of every row of the next forward (None: the base model)."""
        self.rows = torch.tensor([self.slot_of[a] if a else 0 for a in adapters], device=device)
        self.row_scale = self.scale[self.rows].to(self.dtype)[:, None, None]  # (B, 1, 1)

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
        setattr(parent, name, wrapper)
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
