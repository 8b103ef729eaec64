"""Who plays a game: opponents named on the command line or in a config, the agents built for them, and the
assignment of agents to seats."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unstable.agents.base import Agent
from unstable.agents.policy import GenerationClient, PolicyAgent
from unstable.agents.scripted import SCRIPTED_AGENTS, make_scripted_agent
from unstable.games.templates import PromptTemplate
from unstable.records import Checkpoint, EnvSpec, Opponent


def parse_opponent(name: str) -> Opponent:
    """A scripted agent's name (validated, e.g. 'random' or 'kuhn-nash:alpha=0.2') or, for an existing
    directory, the LoRA adapter there as a checkpoint whose uid is the path with PEFT-safe characters."""
    if name.partition(":")[0] in SCRIPTED_AGENTS:
        make_scripted_agent(name, seed=0)  # raises on bad parameters
        return Opponent(name, fixed=name)
    if Path(name).is_dir():
        uid = "opponent-" + re.sub(r"[^\w-]", "_", name)
        return Opponent(uid, checkpoint=Checkpoint(uid=uid, path=name))
    raise ValueError(f"opponent {name!r} is neither a scripted agent ({', '.join(SCRIPTED_AGENTS)}) nor a directory")


def make_agent(
    opponent: Opponent, client: GenerationClient | None, template: PromptTemplate | None, tokenizer: Any, seed: int
) -> Agent:
    """A `PolicyAgent` playing `opponent.checkpoint` through `client` with `template` and `tokenizer`, or else
    the scripted agent `opponent.fixed` drawing its randomness from `seed` (it needs no client or template)."""
    if opponent.checkpoint is not None:
        return PolicyAgent(client, opponent.checkpoint, template, tokenizer)
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
