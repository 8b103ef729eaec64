"""A person plays one game in the terminal against a checkpoint or a pool opponent (`unstable play`).

The checkpoint is served the way `evaluate` serves one (`serving`: the transformers engine in this process, no
Ray); the game is an ordinary `play_episode`, so its record is like every other game's and is saved with
`records.append_games`.
"""

from __future__ import annotations

import json
from pathlib import Path

from unstable.agents.seating import make_agent, parse_opponent
from unstable.evaluation.evaluate import MODEL_UID, serving
from unstable.games.agent import Agent
from unstable.games.episode import DEFAULT_MAX_TURNS, play_episode
from unstable.games.templates import get_template
from unstable.inference import InferenceConfig
from unstable.records import Checkpoint, EnvSpec, GameRecord, Opponent

ADAPTER_CONFIG = "adapter_config.json"  # what PEFT writes into a LoRA adapter directory, with its base model


def resolve_opponent(name: str, model: str | None = None) -> tuple[Opponent, str | None]:
    """The opponent `name` stands for and the base model it is served on (None: it needs no model). A directory
    holding a model's config.json (a full fine-tuning checkpoint) is served as the base model; an adapter
    directory on `model`, or else on the base model its adapter_config.json records; anything else is what
    `parse_opponent` makes of it (a scripted agent, an API model). A ValueError says what is wrong."""
    path = Path(name)
    if not path.is_dir():
        return parse_opponent(name), None
    if (path / ADAPTER_CONFIG).is_file():
        base = model or recorded_base_model(path)
        if not base:
            raise ValueError(f"{ADAPTER_CONFIG} records no base model; name it with --model")
        return parse_opponent(name), base
    if (path / "config.json").is_file():
        if model:
            raise ValueError("is a whole model, not an adapter: it needs no --model")
        return Opponent(MODEL_UID, checkpoint=Checkpoint(MODEL_UID)), name
    raise ValueError(f"neither a LoRA adapter (no {ADAPTER_CONFIG}) nor a model (no config.json)")


def recorded_base_model(adapter: Path) -> str | None:
    """The base model an adapter directory's adapter_config.json names (None when it names none)."""
    try:
        recorded = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"its {ADAPTER_CONFIG} is not JSON: {exc}") from None
    return recorded.get("base_model_name_or_path") if isinstance(recorded, dict) else None


def play_person(
    spec: EnvSpec,
    person: Agent,
    seat: int,
    opponent: Opponent,
    model_path: str | None,
    inference: InferenceConfig,
    *,
    seed: int = 0,
    max_turns: int = DEFAULT_MAX_TURNS,
) -> GameRecord:
    """One game of `spec` with `person` in `seat` and `opponent` in every other seat (served on `model_path` when
    it is a checkpoint); the opponent's seats are the record's `learner_player_ids`, as in an evaluation game."""
    if model_path is None:
        return _play(spec, person, seat, opponent, None, None, seed, max_turns)
    with serving(model_path, inference, seed=seed) as (server, tokenizer):
        return _play(spec, person, seat, opponent, server, tokenizer, seed, max_turns)


def _play(spec, person, seat, opponent, client, tokenizer, seed, max_turns) -> GameRecord:
    """`play_person`'s game, the opponent's agents built on `client` (None for agents that need no model)."""
    template = get_template(spec.prompt_template) if client is not None else None
    agents = {
        pid: person if pid == seat else make_agent(opponent, client, template, tokenizer, seed * spec.num_players + pid)
        for pid in range(spec.num_players)
    }
    others = tuple(pid for pid in agents if pid != seat)
    return play_episode(spec, agents, seed, max_turns=max_turns, is_eval=True, learner_player_ids=others)


def describe_result(record: GameRecord, seat: int) -> str:
    """One line: how the game ended for the person in `seat`, with the env's reason when it gives one and the last
    move (which no observation showed the person)."""
    if record.failed:
        return f"the game failed: {record.error.splitlines()[0]}"
    last = f" (last move: player {record.steps[-1].player_id}, {record.steps[-1].action})" if record.steps else ""
    if record.truncated:
        return f"no result after {len(record.steps)} moves: a draw{last}"
    info = record.game_info.get(seat) or {}
    reason = f": {info['reason']}" if info.get("reason") else ""
    return f"you {({'win': 'won', 'draw': 'drew', 'loss': 'lost'})[record.outcome(seat)]}{reason}{last}"
