"""The RL math shared by the learner's algorithms: V-trace, AWR weights, KL control and normalisation."""

from unstable.rl.awr import awr_weights, normalized_awr_weights, weighted_nll_loss
from unstable.rl.kl import KLController, approx_kl
from unstable.rl.normalize import RunningMeanStd, masked_mean, masked_whiten
from unstable.rl.vtrace import VTraceReturns, discounted_returns, vtrace

__all__ = [
    "KLController",
    "RunningMeanStd",
    "VTraceReturns",
    "approx_kl",
    "awr_weights",
    "discounted_returns",
    "masked_mean",
    "masked_whiten",
    "normalized_awr_weights",
    "vtrace",
    "weighted_nll_loss",
]
