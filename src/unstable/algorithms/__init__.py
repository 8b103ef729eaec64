"""Learning algorithms behind the `BaseAlgo` interface."""

from unstable.algorithms.base import BaseAlgo
from unstable.algorithms.reinforce import Reinforce
from unstable.algorithms.sft import SFT

ALGORITHMS = {"reinforce": Reinforce, "sft": SFT}

__all__ = ["ALGORITHMS", "BaseAlgo", "Reinforce", "SFT"]
