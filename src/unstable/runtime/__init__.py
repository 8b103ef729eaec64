"""The runtime: wires the components into a topology of Ray actors and runs training on it."""

from unstable.runtime.driver import RunSummary, resume_training, run, train
from unstable.runtime.topology import Topology, build_topology

__all__ = ["RunSummary", "Topology", "build_topology", "resume_training", "run", "train"]
