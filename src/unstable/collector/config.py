"""The Collector's settings: which games, how many at once, and who the evaluation games are against."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pydantic import Field, field_validator, model_validator

from unstable.agents.seating import OpponentName
from unstable.games.episode import DEFAULT_MAX_TURNS
from unstable.games.vines import MAX_VINES_AT_ONCE, VineConfig
from unstable.records import EnvSpec
from unstable.settings import Settings

# The most games one kind (training, evaluation) may keep in flight: each game is a thread of the collector's
# process with its env, and the inference server batches only `max_batch_size` requests per pass, so beyond a few
# thousand more games only add memory, threads and waiting (10**11 would exhaust the process's threads).
MAX_GAMES_IN_FLIGHT = 4096


class EnvSpecConfig(Settings):
    """One game: TextArena env id, player count, prompt template. YAML may also give `[id, players, template]`,
    and code an `EnvSpec` record."""

    env_id: str = Field(description="a TextArena env id (`unstable envs` lists them)")
    num_players: int = Field(2, ge=1, description="players per game")
    prompt_template: str = Field("qwen3-zs", description="how an observation becomes a prompt (`games.templates`)")

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        if isinstance(value, EnvSpec):
            return asdict(value)
        if isinstance(value, (list, tuple)):
            return dict(zip(("env_id", "num_players", "prompt_template"), value))
        return value

    @field_validator("env_id")
    @classmethod
    def _known_env(cls, value: str) -> str:
        from unstable.games.registry import validate_env_id

        return validate_env_id(value)

    @field_validator("prompt_template")
    @classmethod
    def _known_template(cls, value: str) -> str:
        from unstable.games.templates import get_template

        get_template(value)
        return value

    def to_spec(self) -> EnvSpec:
        """The record the games code uses."""
        return EnvSpec(self.env_id, self.num_players, self.prompt_template)


# `Collector.evaluate` plays this many evaluation games at once unless told otherwise
EVAL_CONCURRENCY = 16


class CollectorConfig(Settings):
    """How many games run at once, which games, and who the evaluation games are against."""

    num_workers: int = Field(
        8, ge=1, le=MAX_GAMES_IN_FLIGHT, description="training games in flight (each a thread of the collector)"
    )
    num_eval_workers: int = Field(
        0, ge=0, le=MAX_GAMES_IN_FLIGHT, description="evaluation games in flight beside them (each a thread)"
    )
    max_turns: int = Field(DEFAULT_MAX_TURNS, ge=1, description="a game still running after this is a draw")
    training_envs: list[EnvSpecConfig] = Field(min_length=1)
    evaluation_envs: list[EnvSpecConfig] = Field([], description="empty: the training envs")
    evaluation_opponents: list[OpponentName] = Field(
        ["random"],
        min_length=1,
        description="who the evaluation games are against, in turn: scripted agent names, checkpoint directories "
        "or API models ('org/model')",
    )
    group_size: int = Field(
        1, ge=1, description="continuations per training game branched from a copied decision state (1: off)"
    )
    vines: VineConfig = Field(
        VineConfig(),
        description="Monte Carlo continuations from a training game's learner decisions, a return per move "
        "(`games.vines`; `rewards.BaselineByGroup` makes them advantages)",
    )
    max_failed_games_in_a_row: int = Field(
        1000,
        ge=1,
        description="stop the run, with the cause, once this many training games in a row failed (an env that always "
        "raises, a learner whose every generation fails): no training batch can come from such games. Games failing "
        "now and then (an inference actor that died and restarted) are counted and survived",
    )
    pacing: bool = Field(
        True,
        description="start a training game only while the steps in the StepBuffer plus those the training games in "
        "flight are expected to add (their count x the mean steps per finished training game) fit in "
        "buffer.max_buffer_size, so the buffer drops no step before a batch takes it; games in flight always finish "
        "and one is in flight whenever the buffer has room (measured: the same learning in less wall time, "
        "docs/hardware.md). false: a finished training game's slot is refilled at once (steps beyond the buffer's "
        "capacity push out the oldest unused ones)",
    )

    @model_validator(mode="after")
    def _one_kind_of_branching(self) -> CollectorConfig:
        if self.group_size > 1 and self.vines.enabled:
            raise ValueError(
                f"group_size {self.group_size} and vines.rollouts {self.vines.rollouts}: a game either branches "
                "once (group_size) or grows vines, not both"
            )
        return self

    def max_steps_per_game(self) -> int:
        """The most steps one training game can give the StepBuffer: its decisions, times its branches, or plus
        one per vine at each of them."""
        return self.max_turns * (self.group_size + self.vines.rollouts)

    def training_specs(self) -> list[EnvSpec]:
        """The training games as records."""
        return [e.to_spec() for e in self.training_envs]

    def evaluation_specs(self) -> list[EnvSpec]:
        """The evaluation games as records (the training games when none are given)."""
        return [e.to_spec() for e in self.evaluation_envs or self.training_envs]

    def games_in_flight(self) -> int:
        """The most games this collector plays at once: while collecting, its training and evaluation games; in an
        evaluation alone, `EVAL_CONCURRENCY`. Each waits on at most one inference request at a time."""
        return max(self.num_workers + self.num_eval_workers, EVAL_CONCURRENCY)

    def requests_in_flight(self) -> int:
        """The most inference requests this collector has waiting at once: one per game in flight, and with vines
        up to `MAX_VINES_AT_ONCE` per training game while its vines play (an inference actor keeps a thread for
        each, so its control calls never queue behind generation)."""
        per_training_game = MAX_VINES_AT_ONCE if self.vines.enabled else 1
        busiest = self.num_workers * per_training_game + self.num_eval_workers
        return max(self.games_in_flight(), busiest)
