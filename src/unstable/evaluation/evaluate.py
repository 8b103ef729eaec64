"""Evaluate a checkpoint: W/D/L per opponent and seat with Wilson intervals, Kuhn Poker exploitability and the
TicTacToe skill probe (`probe.py`).

Games run concurrently on threads that share one `InferenceServer` (no Ray): the model plays through a
`PolicyAgent`, opponents are scripted agents or other LoRA adapters, and the model's seat alternates from
game to game. Game `i` against every opponent uses seed `seed + i`, so two checkpoints evaluated with the
same settings meet the same deals and openings.

For Kuhn Poker the exploitability of the model's first-round policy is exact: at each information set the
log-probability of every legal move's completion is scored with the learner's forward pass, giving the
probability of the aggressive move, and `exploitability` computes the best responses to that strategy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from unstable.agents.policy import GenerationClient, PolicyAgent
from unstable.agents.seating import make_agent, parse_opponent, seat_agents
from unstable.collector.demonstrations import supervised_step
from unstable.evaluation.probe import format_probe, probe_report
from unstable.games.episode import DEFAULT_MAX_TURNS, play_episode
from unstable.games.kuhn import KuhnInfoSet, aggressive_probability, exploitability, kuhn_information_sets
from unstable.games.templates import get_template
from unstable.inference import InferenceConfig, InferenceServer, make_backend
from unstable.learner import LoraConfig, PolicyConfig, PolicyModel
from unstable.records import Checkpoint, EnvSpec, GameRecord, Opponent, Step
from unstable.tracking.stats import wdl_summary

MODEL_UID = "model"
DEFAULT_INFERENCE = InferenceConfig(max_new_tokens=8, num_threads=None)


def play_matches(
    client: GenerationClient,
    model: Checkpoint,
    spec: EnvSpec,
    opponent: Opponent,
    num_games: int,
    *,
    tokenizer: Any = None,
    seed: int = 0,
    concurrency: int = 32,
    max_turns: int = DEFAULT_MAX_TURNS,
    on_game: Callable[[GameRecord], None] = lambda record: None,
) -> list[GameRecord]:
    """Play `num_games` games of `model` against `opponent`, the model's seat alternating; game `i` uses seed
    `seed + i` and puts the model in seat `i % num_players`, and every seat samples from seeds of its own (seat and
    game), so the same settings play the same games however the concurrent games interleave. `on_game` sees each
    record as its game ends."""
    template = get_template(spec.prompt_template)

    def play(game: int) -> GameRecord:
        game_seed, model_seat = seed + game, game % spec.num_players

        def seat_seed(pid: int) -> int:
            return game_seed * spec.num_players + pid

        agents, model_seats = seat_agents(
            spec,
            model_seat,
            lambda: PolicyAgent(client, model, template, tokenizer, sampling_seed=seat_seed(model_seat)),
            lambda pid: make_agent(opponent, client, template, tokenizer, seat_seed(pid), sampling_seed=seat_seed(pid)),
            mirror=False,
        )
        record = play_episode(
            spec, agents, game_seed, max_turns=max_turns, is_eval=True, learner_player_ids=model_seats
        )
        on_game(record)
        return record

    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, num_games)), thread_name_prefix="eval") as pool:
        return list(pool.map(play, range(num_games)))


def summarize_matches(records: list[GameRecord]) -> dict[str, Any]:
    """The model's W/D/L per seat (`seat_0`, `seat_1`, ...) and over all seats, failed and truncated games,
    and the share of the model's moves that were well formatted and that the env accepted."""
    finished = [r for r in records if not r.failed]
    seats = sorted({r.learner_player_ids[0] for r in records})
    by_seat = {seat: [r.outcome(seat) for r in finished if r.learner_player_ids[0] == seat] for seat in seats}
    moves = [s for r in finished for s in r.steps if s.player_id in r.learner_player_ids]
    return {
        "seats": {f"seat_{seat}": wdl_summary(outcomes) for seat, outcomes in by_seat.items()},
        "all_seats": wdl_summary(r.outcome(r.learner_player_ids[0]) for r in finished),
        "failed": len(records) - len(finished),
        "truncated": sum(r.truncated for r in finished),
        "moves": len(moves),
        "format_ok_rate": sum(s.format_ok for s in moves) / max(len(moves), 1),
        "valid_move_rate": sum(not s.invalid_move for s in moves) / max(len(moves), 1),
    }


def scoring_policy(model_path: str, adapter: str | None = None) -> PolicyModel:
    """The model (plus LoRA `adapter`) loaded for scoring, in eval mode; it scores each step at the step's
    temperature and top_p."""
    policy = PolicyModel(model_path, PolicyConfig(lora=LoraConfig() if adapter else None, initial_lora_path=adapter))
    policy.load()
    policy.model.eval()
    return policy


def kuhn_strategy(
    policy: PolicyModel, spec: EnvSpec, infosets: list[KuhnInfoSet], temperature: float = 1.0
) -> dict[str, float]:
    """The model's probability of the aggressive move at each information set at `temperature`, renormalised
    over the two legal moves, each scored as the completion `template.format_action(move)` + eos."""
    moves = [
        Step(spec.env_id, info.env_player_id, 0, info.observation, action, temperature=temperature)
        for info in infosets
        for action in info.legal_actions
    ]
    steps = [supervised_step(move, spec, policy.tokenizer) for move in moves]
    scores = iter(policy.completion_logprobs(steps))
    return {info.key: aggressive_probability({a: next(scores) for a in info.legal_actions}) for info in infosets}


def kuhn_exploitability(
    model_path: str,
    spec: EnvSpec,
    adapter: str | None = None,
    temperature: float = 1.0,
    infosets: list[KuhnInfoSet] | None = None,
) -> dict[str, Any]:
    """Exact exploitability (chips per round) of the model's first-round Kuhn Poker policy at `temperature`,
    with the strategy it was computed from. Pass `infosets` to reuse `kuhn_information_sets(spec.env_id)`."""
    infosets = infosets if infosets is not None else list(kuhn_information_sets(spec.env_id))
    strategy = kuhn_strategy(scoring_policy(model_path, adapter), spec, infosets, temperature)
    return {"exploitability": float(exploitability(strategy)), "strategy": strategy}


def is_kuhn(spec: EnvSpec) -> bool:
    """True for TextArena's Kuhn Poker envs."""
    return spec.env_id.startswith("KuhnPoker-")


@contextmanager
def serving(
    model_path: str, inference: InferenceConfig, adapters: int = 1, seed: int = 0
) -> Iterator[tuple[InferenceServer, Any]]:
    """A started in-process `InferenceServer` on the transformers engine for `model_path` (room for `adapters` LoRA
    adapters, loaded when a request names one) and its tokenizer; the server stops on leaving."""
    inference = inference.model_copy(update={"backend": "transformers", "max_loras": adapters})
    backend = make_backend(model_path, inference, seed=seed)
    server = InferenceServer(lambda: backend, inference)
    server.start()
    try:
        yield server, backend.tokenizer
    finally:
        server.stop()


def evaluate(
    model_path: str,
    spec: EnvSpec,
    opponents: list[str],
    *,
    adapter: str | None = None,
    games_per_opponent: int = 20,
    inference: InferenceConfig = DEFAULT_INFERENCE,
    concurrency: int = 32,
    seed: int = 0,
    max_turns: int = DEFAULT_MAX_TURNS,
    probe_positions: int = 0,
    on_game: Callable[[GameRecord], None] = lambda record: None,
) -> dict[str, Any]:
    """Play the checkpoint (`model_path` plus optional LoRA `adapter`) against each opponent and return the
    JSON-ready report; for Kuhn Poker it also holds the exact exploitability under `"kuhn"`, and with
    `probe_positions` (TicTacToe only) the skill probe at that many positions under `"probe"`. `inference` sets
    the sampling and threads of the transformers engine the games share; `on_game` sees each finished game
    (a progress bar counts them)."""
    parsed = {name: parse_opponent(name) for name in opponents}
    adapters = sum(o.checkpoint is not None for o in parsed.values()) + 1
    model = Checkpoint(MODEL_UID, adapter)
    with serving(model_path, inference, adapters, seed) as (server, tokenizer):
        results = {
            name: summarize_matches(
                play_matches(
                    server,
                    model,
                    spec,
                    opponent,
                    games_per_opponent,
                    tokenizer=tokenizer,
                    seed=seed,
                    concurrency=concurrency,
                    max_turns=max_turns,
                    on_game=on_game,
                )
            )
            for name, opponent in parsed.items()
        }
    report = {
        "model": model_path,
        "adapter": adapter,
        "env": asdict(spec),
        "games_per_opponent": games_per_opponent,
        "sampling": asdict(inference.sampling),
        "seed": seed,
        "opponents": results,
    }
    if is_kuhn(spec):
        report["kuhn"] = kuhn_exploitability(model_path, spec, adapter, inference.temperature or 1.0)
    if probe_positions:
        report["probe"] = probe_report(scoring_policy(model_path, adapter), spec, probe_positions, seed)
    return report


def format_report(report: dict[str, Any]) -> str:
    """The report as a text table: one row per opponent and seat plus an all-seats row."""
    lines = [
        f"{'opponent':<28} {'seat':>5} {'games':>5}  {'win [95% CI]':<19} {'draw':>5} {'loss':>5} "
        f"{'non-loss':>8} {'format':>6} {'valid':>6}"
    ]
    for name, result in report["opponents"].items():
        rows = [*result["seats"].items(), ("all", result["all_seats"])]
        for seat, wdl in rows:
            low, high = wdl["win_ci"]
            lines.append(
                f"{name:<28} {seat.removeprefix('seat_'):>5} {wdl['games']:>5}  "
                f"{wdl['win_rate']:.2f} [{low:.2f}, {high:.2f}]   {wdl['draw_rate']:>5.2f} {wdl['loss_rate']:>5.2f} "
                f"{1 - wdl['loss_rate']:>8.2f} {result['format_ok_rate']:>6.2f} {result['valid_move_rate']:>6.2f}"
            )
    if "kuhn" in report:
        lines.append(f"Kuhn Poker exploitability (chips/round): {report['kuhn']['exploitability']:.4f}")
    if "probe" in report:
        lines.append(
            f"TicTacToe skill probe: the policy's mass on each skill's cells, {report['probe']['positions']} positions"
        )
        lines.append(format_probe({report["model"]: report["probe"]["skills"]}))
    return "\n".join(lines)


def write_report(report: dict[str, Any], path: str | Path) -> Path:
    """Write the report as indented JSON (creating parent directories); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    return path
