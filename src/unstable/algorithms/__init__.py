"""Learning algorithms behind the `BaseAlgo` interface."""

from unstable.algorithms.a2c import A2C
from unstable.algorithms.base import BaseAlgo
from unstable.algorithms.group_baseline import GroupBaseline
from unstable.algorithms.mmd import MagneticMirrorDescent
from unstable.algorithms.ppo import PPO
from unstable.algorithms.reinforce import Reinforce
from unstable.algorithms.sft import SFT
from unstable.algorithms.vtrace_awr import VTraceAWR

ALGORITHMS = {
    "reinforce": Reinforce,
    "group_baseline": GroupBaseline,
    "ppo": PPO,
    "a2c": A2C,
    "vtrace_awr": VTraceAWR,
    "mmd": MagneticMirrorDescent,
    "sft": SFT,
}

__all__ = [
    "A2C",
    "ALGORITHMS",
    "BaseAlgo",
    "GroupBaseline",
    "MagneticMirrorDescent",
    "PPO",
    "Reinforce",
    "SFT",
    "VTraceAWR",
]
