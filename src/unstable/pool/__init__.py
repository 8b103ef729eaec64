"""The opponent pool and its rating system."""

from unstable.pool.model_pool import ModelPool
from unstable.pool.ratings import MatchMatrix, Rating, RatingSystem
from unstable.pool.sampling import SAMPLE_MODES

__all__ = ["SAMPLE_MODES", "MatchMatrix", "ModelPool", "Rating", "RatingSystem"]
