"""The learner: batches in, updated checkpoints out."""

from unstable.learner.learner import StandardLearner

__all__ = ["StandardLearner"]
