"""Typed records that cross component boundaries: one model decision, one finished game, checkpoints.

Data flows one way: a game produces a `GameRecord` holding `Step`s; the buffer turns steps into training
samples (a `Step` with its `reward` filled in); the learner turns samples into a batch and a loss.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

# the file, in a directory of saved games, that `append_games` adds each game's records to
GAMES_FILE = "records.jsonl"


@dataclass(frozen=True)
class EnvSpec:
    """A game to play: TextArena env id, number of players and the prompt template to render it with."""

    env_id: str
    num_players: int = 2
    prompt_template: str = "qwen3-zs"


@dataclass(frozen=True)
class Checkpoint:
    """A policy the inference engine can serve, named by `uid`.

    `kind="lora"`: `path` is a PEFT adapter directory (None = the base model). `kind="full"`: `path` is a whole
    fine-tuned model that replaces the engine's base weights (only the newest full checkpoint is servable).
    """

    uid: str
    path: str | None = None
    version: int = 0
    kind: str = "lora"

    @property
    def is_adapter(self) -> bool:
        """True when serving this checkpoint means applying a LoRA adapter."""
        return self.kind == "lora" and self.path is not None


def checkpoint_uid(version: int) -> str:
    """The uid of the learner's checkpoint of update `version` (-1: the starting policy), as the pool names it."""
    return f"ckpt-{version}"


@dataclass(frozen=True)
class Opponent:
    """Who fills a seat: a policy checkpoint served by the inference engine, a scripted/fixed agent, or a model
    behind an OpenAI-compatible chat-completions endpoint (`api_model`, e.g. 'google/gemini-2.0-flash-lite-001')."""

    agent_id: str
    checkpoint: Checkpoint | None = None
    fixed: str | None = None
    api_model: str | None = None


def mixed_seed(*parts: int) -> int:
    """A 32-bit seed hashed from `parts` (vLLM also seeds numpy with it, which takes 32 bits): an inference actor's
    own sampling stream, a seeded request's seed."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete with the policy named by `checkpoint` (None: the base model).

    `game` names the game it belongs to (its seed; None: none): an `InferenceClient` keeps a game's requests, every
    seat's and branch's, on one inference server, whose prefix cache holds the game's earlier prompts. `seed` makes
    its sampling a function of the seed, the prompt and the weights alone, whatever other requests the engine runs
    beside it (None: the engine's own sampling stream); evaluations seed their requests so that they repeat."""

    prompt: str
    checkpoint: Checkpoint | None = None
    game: int | None = None
    seed: int | None = None


@dataclass(frozen=True)
class GenerationResult:
    """A completion with the exact tokens, the log-probability of each under the distribution it was drawn from,
    and the `temperature` and `top_p` it was sampled with.

    `logprobs[i]` is `log q(completion_token_ids[i])`, q the tempered distribution `softmax(logits / temperature)`
    cut to its top-p nucleus and renormalised (when `top_p < 1`); greedy decoding (`temperature == 0`) records
    the untruncated temperature-1 log-probs. This is the behaviour policy the learner corrects against.

    `served_by`, set by the inference server, is the checkpoint whose weights produced it: the one requested, or
    the newer full checkpoint loaded in its place (a game started before a full-weight update).
    `cached_prompt_tokens` of the prompt's tokens came from the engine's prefix cache instead of a prefill.
    """

    text: str
    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str = "stop"
    temperature: float = 1.0
    top_p: float = 1.0
    served_by: Checkpoint | None = None
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class Decision:
    """What an agent returns for one observation: the action to submit plus, for model agents, the tokens and
    the sampling settings they were drawn with (as in `GenerationResult`)."""

    action: str
    raw_output: str = ""
    prompt: str = ""
    prompt_token_ids: tuple[int, ...] = ()
    completion_token_ids: tuple[int, ...] = ()
    behaviour_logprobs: tuple[float, ...] = ()
    format_ok: bool = True
    checkpoint: Checkpoint | None = None
    generation_seconds: float = 0.0
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass(frozen=True)
class Step:
    """One decision of one player in one game, with everything the learner needs to score it exactly.

    `prompt_token_ids` and `completion_token_ids` are the tokens the model actually saw and produced, and
    `behaviour_logprobs[i]` is the log-probability the sampling policy gave `completion_token_ids[i]`, under the
    distribution `temperature` and `top_p` describe (see `GenerationResult`; the defaults, temperature 1 and no
    truncation, also describe supervised demonstrations). The learner trains on these tokens as they are, never
    re-tokenising text, and scores them under the same `temperature` and `top_p`. `reward` is set by the StepBuffer.
    `group_id` is shared by the decisions sampled from one copied game state (see `games.branching`); the
    group's mean reward is their baseline. `opponent` names the agents in the other seats ('+'-joined), set by
    the StepBuffer, so a per-opponent baseline can compare games against the same opponent.
    `decisions_after` and `next_prompt_token_ids` are facts of the game that `link_decisions` fills in when the
    StepBuffer takes the game: how many decisions the same player makes later, and the prompt of its next one
    (empty at its last), the state whose value a bootstrapping critic (`A2C(bootstrap=...)`) reads. A discount
    (`rewards.DiscountLaterDecisions`) reads the first. `value_after` is the Monte Carlo value of the state this
    move led to, when vines measured it (`games.vines`): the mean return, in the env's own rewards, of the game and
    its vines at the same player's next vined decision; `BaselineByGroup(bootstrap=True)` scores the move by it.
    """

    env_id: str
    player_id: int
    turn: int
    observation: str
    action: str
    raw_output: str = ""
    prompt: str = ""
    prompt_token_ids: tuple[int, ...] = ()
    completion_token_ids: tuple[int, ...] = ()
    behaviour_logprobs: tuple[float, ...] = ()
    format_ok: bool = True
    invalid_move: bool = False
    checkpoint_uid: str | None = None
    policy_version: int = 0
    generation_seconds: float = 0.0
    reward: float = 0.0
    group_id: str | None = None
    opponent: str = ""
    next_prompt_token_ids: tuple[int, ...] = ()
    decisions_after: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    value_after: float | None = None

    @property
    def has_tokens(self) -> bool:
        """True when the step came from a model and carries token ids the learner can train on."""
        return len(self.completion_token_ids) > 0


@dataclass(frozen=True)
class GameRecord:
    """One finished (or failed) game: who played which seat, every step, and TextArena's final result.

    A vine (`games.vines`) is a continuation of another game from its decision at `vine_turn`: its steps start
    there, and only that first decision is trained on (the rest measured its return). None: a whole game.
    """

    env_id: str
    seed: int
    players: dict[int, str]
    steps: tuple[Step, ...]
    rewards: dict[int, float]
    game_info: dict[int, dict[str, Any]] = field(default_factory=dict)
    is_eval: bool = False
    learner_player_ids: tuple[int, ...] = ()
    error: str | None = None
    truncated: bool = False
    wall_seconds: float = 0.0
    vine_turn: int | None = None

    @property
    def failed(self) -> bool:
        """True when the game did not reach a result (env crash, agent crash or missing rewards)."""
        return self.error is not None

    def outcome(self, player_id: int) -> str:
        """'win', 'draw' or 'loss' for the given seat, judged against the best reward at the table."""
        mine = self.rewards[player_id]
        others = [r for pid, r in self.rewards.items() if pid != player_id]
        if not others:
            return "win" if mine > 0 else "draw" if mine == 0 else "loss"
        best_other = max(others)
        return "win" if mine > best_other else "draw" if mine == best_other else "loss"


def link_decisions(steps: Sequence[Step]) -> tuple[Step, ...]:
    """`steps` (one game's, in order) as new steps each holding `decisions_after` and `next_prompt_token_ids`: how
    many decisions its player makes later in the game and that player's next prompt (empty at its last)."""
    later: Counter[int] = Counter()
    next_prompt: dict[int, tuple[int, ...]] = {}
    linked = []
    for step in reversed(steps):
        pid = step.player_id
        linked.append(replace(step, decisions_after=later[pid], next_prompt_token_ids=next_prompt.get(pid, ())))
        later[pid] += 1
        next_prompt[pid] = step.prompt_token_ids
    return tuple(reversed(linked))


def append_games(directory: str | Path, records: list[GameRecord]) -> Path:
    """Append one game's records (one, or its branches) as a JSON list on one line of `directory/GAMES_FILE`,
    making `directory` if needed; returns the file. The one format in which games are saved (the collector's
    test hook, `unstable play`); the caller serialises concurrent writers."""
    path = Path(directory) / GAMES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps([asdict(record) for record in records], default=str) + "\n")
    return path
