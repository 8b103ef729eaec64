"""Supervised steps from scripted agents' moves: games between scripted agents, each valid move turned into a
`Step` that carries the tokens a model would need to have played it, for warm-start fine-tuning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from unstable.agents.seating import make_agent
from unstable.games.episode import DEFAULT_MAX_TURNS, play_episode
from unstable.games.templates import get_template
from unstable.records import EnvSpec, Opponent, Step


def supervised_step(step: Step, spec: EnvSpec, tokenizer: Any) -> Step:
    """`step` (a move of any agent) with the tokens a model would need to have played it.

    The prompt is tokenised exactly as the inference backends do (no special tokens added); the completion
    is the template's rendering of `step.action` followed by the eos token id, so the model learns to stop.
    Behaviour log-probs are zeros: no sampling policy produced these tokens.
    """
    template = get_template(spec.prompt_template)
    prompt = template.render(step.observation, tokenizer)
    completion = template.format_action(step.action)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = [*tokenizer(completion, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    return replace(
        step,
        raw_output=completion,
        prompt=prompt,
        prompt_token_ids=tuple(prompt_ids),
        completion_token_ids=tuple(completion_ids),
        behaviour_logprobs=(0.0,) * len(completion_ids),
        format_ok=True,
    )


def generate_sft_steps(
    spec: EnvSpec,
    agents: Sequence[str],
    num_games: int,
    tokenizer: Any,
    *,
    seed: int = 0,
    max_turns: int = DEFAULT_MAX_TURNS,
) -> list[Step]:
    """Play `num_games` games between the scripted `agents` (one name per seat, rotated one seat per game)
    and return every valid move as a supervised step. Moves the env rejected are left out."""
    if len(agents) != spec.num_players:
        raise ValueError(f"{spec.env_id} needs {spec.num_players} agents, got {list(agents)}")
    steps = []
    for game in range(num_games):
        game_seed = seed + game
        names = {pid: agents[(pid + game) % len(agents)] for pid in range(spec.num_players)}
        seated = {
            pid: make_agent(Opponent(name, fixed=name), None, None, tokenizer, seed=game_seed * spec.num_players + pid)
            for pid, name in names.items()
        }
        record = play_episode(spec, seated, game_seed, max_turns=max_turns)
        steps += [supervised_step(s, spec, tokenizer) for s in record.steps if s.format_ok and not s.invalid_move]
    return steps
