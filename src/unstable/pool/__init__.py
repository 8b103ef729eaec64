"""The opponent pool and its rating system."""

from unstable.pool.model_pool import SAMPLE_MODES, ModelPool
from unstable.pool.ratings import Rating, RatingSystem

__all__ = ["SAMPLE_MODES", "ModelPool", "Rating", "RatingSystem"]
