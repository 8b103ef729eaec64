"""The Tracker's settings: the rolling window of its rates and where its rows go besides `metrics.jsonl`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from unstable.settings import Settings


class TrackerConfig(Settings):
    """Every row always goes to `run_dir/metrics.jsonl` (its tables, `keys.TABLES`, to `tables.json` and
    `tables.jsonl`); TensorBoard and W&B are optional sinks."""

    window_games: int = Field(
        100, ge=1, description="rates, game lengths, action entropy and eval W/D/L cover this many latest games"
    )
    tables_every: int = Field(
        10,
        ge=1,
        description="append the ladder and match matrix to tables.jsonl (their history) every this many learner "
        "steps; tables.json always holds the newest",
    )
    tensorboard: bool = Field(True, description="also write each row's scalars to run_dir/tensorboard")
    wandb: Literal["auto", "online", "offline", "disabled"] = Field(
        "auto",
        description="W&B mode; 'auto': online when WANDB_API_KEY is set, offline otherwise, skipped (with a "
        "warning) when wandb is not installed; 'disabled' turns W&B off",
    )
    wandb_project: str = Field("unstable-baselines", description="the W&B project rows go to")
