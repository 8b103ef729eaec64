"""The opponent pool's settings: how opponents are sampled, which fixed opponents exist, how games are rated."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from unstable.agents.seating import OpponentName
from unstable.pool.ratings import RATING_BACKENDS
from unstable.pool.sampling import SAMPLE_MODES
from unstable.settings import Settings, check_registered


class PoolConfig(Settings):
    """Opponent sampling (`sample_mode`, one of `pool.SAMPLE_MODES`) and ratings (`pool.RATING_BACKENDS`)."""

    sample_mode: str = Field("mirror", description="how opponents are drawn, one of `pool.SAMPLE_MODES`")
    fixed_opponents: list[OpponentName] = Field(
        [], description="training opponents besides checkpoints: scripted agents, checkpoint directories, API models"
    )
    max_active_lora: int = Field(3, ge=1, description="newest checkpoints that may be sampled as opponents")
    max_retired: int = Field(
        20,
        ge=0,
        description="retired checkpoints (older than the newest max_active_lora: never sampled again) the pool keeps "
        "rated; beyond it, the lowest on the ladder (provisional first, then lowest mu - 3 sigma) is forgotten: its "
        "rating, match-matrix row and column, and its place in the pool, so the tables and the resume state stay "
        "bounded however long the run",
    )
    lag: int = Field(1, ge=1, description="sample_mode 'lagged': checkpoints before the latest to draw from")
    beta: float = Field(4.0, gt=0, description="rating performance noise; also the scale of 'ts-dist'")
    rating_backend: str = Field("trueskill", description="one of `pool.ratings.RATING_BACKENDS`")
    rating_anchor: str | None = Field(
        None,
        description="a fixed opponent whose rating is never updated: the others are measured against a fixed "
        "reference (every new checkpoint starts from the prior, at the anchor's mu). Without one the common level "
        "drifts (checkpoints take points from opponents that never change), so ratings of different times do not "
        "compare",
    )
    ladder_min_games: int = Field(
        30,
        ge=0,
        description="rated games an agent needs to be ranked on the ladder; one with fewer is listed after the "
        "ranked ones as provisional, without odds against the latest checkpoint (an anchor is always ranked)",
    )

    @field_validator("sample_mode")
    @classmethod
    def _known_mode(cls, value: str) -> str:
        return check_registered(value, SAMPLE_MODES, "sample_mode")

    @field_validator("rating_backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        return check_registered(value, RATING_BACKENDS, "rating_backend")

    @model_validator(mode="after")
    def _fixed_needs_opponents(self) -> PoolConfig:
        if self.sample_mode == "fixed" and not self.fixed_opponents:
            raise ValueError("sample_mode 'fixed' needs at least one entry in fixed_opponents")
        return self

    @model_validator(mode="after")
    def _anchor_is_fixed(self) -> PoolConfig:
        if self.rating_anchor is not None and self.rating_anchor not in self.fixed_opponents:
            raise ValueError(
                f"rating_anchor {self.rating_anchor!r} must be one of fixed_opponents {self.fixed_opponents}"
            )
        return self

    @model_validator(mode="after")
    def _lag_stays_active(self) -> PoolConfig:
        if self.sample_mode == "lagged" and self.lag >= self.max_active_lora:
            raise ValueError(
                f"sample_mode 'lagged' with lag={self.lag} needs max_active_lora > lag "
                f"(got {self.max_active_lora}): the lagged checkpoints must stay active"
            )
        return self
