"""The opponent pool and its rating system."""

from unstable.pool.model_pool import SAMPLE_MODES, ModelPool
from unstable.pool.ratings import MatchMatrix, Rating, RatingSystem

__all__ = ["SAMPLE_MODES", "MatchMatrix", "ModelPool", "Rating", "RatingSystem"]
