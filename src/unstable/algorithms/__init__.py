"""Learning algorithms behind the `BaseAlgo` interface."""

from unstable.algorithms.base import BaseAlgo
from unstable.algorithms.reinforce import Reinforce

ALGORITHMS = {"reinforce": Reinforce}

__all__ = ["ALGORITHMS", "BaseAlgo", "Reinforce"]
