"""A minimal RL library (ubrl's, rebuilt from its README): `TorchTrainer` trains any `Agent` from episodes with V-trace
advantages, AWR weights, a KL Lagrange multiplier and value fitting on frozen encodings. Its math (also used by
the `vtrace_awr` LLM algorithm) lives in `vtrace`, `awr`, `kl` and `normalize`; `cli` is a train/tune launcher
and `gym_utils` adapts gymnasium environments."""

from unstable.rl.agent import Agent, AgentOutput
from unstable.rl.awr import awr_weights, normalized_awr_weights, weighted_nll_loss
from unstable.rl.config import Choice, FloatRange, IntRange, TrainerConfig, knob
from unstable.rl.kl import KLController, approx_kl
from unstable.rl.normalize import RunningMeanStd, masked_mean, masked_whiten
from unstable.rl.trainer import TorchTrainer
from unstable.rl.vtrace import VTraceReturns, discounted_returns, vtrace

__all__ = [
    "Agent",
    "AgentOutput",
    "Choice",
    "FloatRange",
    "IntRange",
    "KLController",
    "RunningMeanStd",
    "TorchTrainer",
    "TrainerConfig",
    "VTraceReturns",
    "approx_kl",
    "awr_weights",
    "discounted_returns",
    "knob",
    "masked_mean",
    "masked_whiten",
    "normalized_awr_weights",
    "vtrace",
    "weighted_nll_loss",
]
