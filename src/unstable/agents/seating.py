"""Who plays a game: opponents named on the command line or in a config, the agents built for them, and the
assignment of agents to seats."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator

from unstable.agents.api import APIAgent, APISettings
from unstable.agents.policy import GenerationClient, PolicyAgent
from unstable.agents.scripted import SCRIPTED_AGENTS, make_scripted_agent
from unstable.games.agent import Agent
from unstable.games.templates import PromptTemplate
from unstable.records import Checkpoint, EnvSpec, Opponent

# An API model as OpenRouter names them, "org/model"; parse_opponent also rejects a leading ".".
_API_MODEL = re.compile(r"[A-Za-z0-9_.:-]+/[A-Za-z0-9_.:-]+")


def parse_opponent(name: str) -> Opponent:
    """The opponent `name` stands for, tried in order: an existing directory is a LoRA adapter checkpoint whose
    uid is the path with PEFT-safe characters; a scripted agent's name (validated, e.g. 'random' or
    'kuhn-nash:alpha=0.2'); an 'org/model' name is a model behind the chat-completions API (see `agents.api`)."""
    if Path(name).is_dir():
        uid = "opponent-" + re.sub(r"[^\w-]", "_", name)
        return Opponent(uid, checkpoint=Checkpoint(uid=uid, path=name))
    if name.partition(":")[0] in SCRIPTED_AGENTS:
        make_scripted_agent(name, seed=0)  # raises on bad parameters
        return Opponent(name, fixed=name)
    if _API_MODEL.fullmatch(name) and not name.startswith("."):
        return Opponent(name, api_model=name)
    missing = f"directory {name!r} does not exist; " if _looks_like_path(name) else ""
    raise ValueError(
        f"{missing}opponent {name!r} must be an existing LoRA checkpoint directory, a scripted agent "
        f"({', '.join(SCRIPTED_AGENTS)}) or an API model 'org/model' (e.g. 'google/gemini-2.0-flash-lite-001')"
    )


def _checked_opponent(name: str) -> str:
    """`name` if `parse_opponent` accepts it (its ValueError otherwise)."""
    parse_opponent(name)
    return name


OpponentName = Annotated[str, AfterValidator(_checked_opponent)]
"""A settings field type: an opponent name that `parse_opponent` accepts, checked when the settings load."""


def _looks_like_path(name: str) -> bool:
    """True for names written as file paths rather than agent or model names."""
    return "/" in name or "\\" in name or name.startswith((".", "~"))


def make_agent(
    opponent: Opponent,
    client: GenerationClient | None,
    template: PromptTemplate | None,
    tokenizer: Any,
    seed: int,
    game: int | None = None,
    sampling_seed: int | None = None,
) -> Agent:
    """A `PolicyAgent` playing `opponent.checkpoint` through `client` with `template` and `tokenizer` in `game`
    (its requests seeded from `sampling_seed`, None: unseeded); an `APIAgent` for `opponent.api_model` configured from
    the environment (`APISettings.from_env`); or else the scripted agent `opponent.fixed` drawing its randomness from
    `seed` (these two need no client or template)."""
    if opponent.checkpoint is not None:
        return PolicyAgent(client, opponent.checkpoint, template, tokenizer, game, sampling_seed)
    if opponent.api_model is not None:
        return APIAgent(opponent.api_model, APISettings.from_env())
    return make_scripted_agent(opponent.fixed, seed=seed)


def seat_agents(
    spec: EnvSpec,
    learner_seat: int,
    make_learner: Callable[[], Agent],
    make_opponent: Callable[[int], Agent],
    mirror: bool,
) -> tuple[dict[int, Agent], tuple[int, ...]]:
    """Fill every seat: the learner at `learner_seat`, opponents elsewhere; in mirror self-play every seat
    plays the learner's checkpoint and every seat's steps are training data."""
    if mirror:
        return {pid: make_learner() for pid in range(spec.num_players)}, tuple(range(spec.num_players))
    agents = {pid: make_learner() if pid == learner_seat else make_opponent(pid) for pid in range(spec.num_players)}
    return agents, (learner_seat,)
