"""Does a Kuhn Poker policy tell the Queen from the King? Two measurements (experiments/log.md, "Kuhn Poker's floor").

`floor`: the least exploitability of any strategy that plays given information sets alike (a local search over the
free probabilities from random starts): the best a card-coarsened policy can do. `--alike QK` (the default) ties the
Queen and the King at every betting history; `--alike Jc=Qc J=Q` ties those information sets only.

`probe CHECKPOINT`: full-batch supervised steps (Adam) toward given moves at given information sets, printing the
model's probability of the aggressive move as it goes: how many steps the model needs to play two cards apart when
told to, against what RL gives it.

`anchored`: where a KL anchor to even play lets self-play settle, whatever the model: the regularised equilibrium
(each information set's policy proportional to the anchor's times exp(advantage / tau), the agent quantal response
equilibrium that magnetic mirror descent converges to) at each temperature tau in chips, its exploitability, and the
spread of the moves' advantages there (a z-scored advantage divides by it, so an anchor coefficient c is tau = c x
spread chips). With `--resets N`, R-NaD's outer loop after it: the anchor replaced by the equilibrium it led to, N
times, each reset's exploitability.

    python experiments/kuhn_card_reading.py floor
    python experiments/kuhn_card_reading.py floor --alike Jc=Qc J=Q --restarts 12
    python experiments/kuhn_card_reading.py probe RUN/checkpoints/ckpt-600 --targets "Qb:[fold]" "Kb:[call]"
    python experiments/kuhn_card_reading.py anchored --taus 1 0.5 0.3 0.2 0.1
    python experiments/kuhn_card_reading.py anchored --taus 0.5 --resets 8
"""

from __future__ import annotations

import argparse
import itertools
import math
import random

from unstable.games.kuhn import CARDS, FIRST_PLAYER_INFOSETS, INFOSETS, deal_value, exploitability, game_value

HISTORIES = tuple(dict.fromkeys(infoset[1:] for infoset in INFOSETS))  # the betting before a card's move


def alike_slots(groups: list[str]) -> list[tuple[str, ...]]:
    """The information sets that share one probability, from `groups`: "QK" (those cards alike at every history) or
    "Jc=Qc" (those information sets alike); sets in no group stand alone. Overlapping groups merge."""
    slots = [{infoset} for infoset in INFOSETS]
    for group in groups:
        ties = [group.split("=")] if "=" in group else [[card + history for card in group] for history in HISTORIES]
        for tie in ties:
            if len(tie) < 2 or not set(tie) <= set(INFOSETS):
                raise ValueError(f"--alike {group!r}: name two or more cards ('QK') or information sets ('Jc=Qc')")
            slots = _merged(slots, set(tie))
    ordered = sorted(slots, key=lambda slot: min(map(INFOSETS.index, slot)))  # the order of INFOSETS
    return [tuple(infoset for infoset in INFOSETS if infoset in slot) for slot in ordered]


def _merged(slots: list[set[str]], tied: set[str]) -> list[set[str]]:
    joined = set().union(*(slot for slot in slots if slot & tied))
    return [slot for slot in slots if not slot & tied] + [joined]


def alike_strategy(slots: list[tuple[str, ...]], probabilities: list[float]) -> dict[str, float]:
    """A full strategy from one probability per slot, the slot's information sets sharing it."""
    return {infoset: p for slot, p in zip(slots, probabilities, strict=True) for infoset in slot}


def least_exploitable_alike(
    slots: list[tuple[str, ...]], restarts: int, seed: int = 0
) -> tuple[float, dict[str, float]]:
    """Coordinate descent with random kicks from `restarts` random starts; the best exploitability and strategy."""
    rng = random.Random(seed)
    score = lambda p: float(exploitability(alike_strategy(slots, p)))  # noqa: E731
    best = (float("inf"), [])
    for _ in range(restarts):
        point = [rng.random() for _ in slots]
        value, step = score(point), 0.25
        while step > 1e-4:
            moves = [_nudged(point, i, d) for i in range(len(point)) for d in (step, -step)]
            moves += [[_clip(x + rng.uniform(-step, step)) for x in point] for _ in range(200)]
            better = next(((m, v) for m in moves if (v := score(m)) < value - 1e-12), None)
            if better:
                point, value = better
            else:
                step /= 2
        best = min(best, (value, point))
    return best[0], alike_strategy(slots, best[1])


def _nudged(point: list[float], index: int, delta: float) -> list[float]:
    return [_clip(x + delta) if i == index else x for i, x in enumerate(point)]


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


def probe(checkpoint: str, targets: list[str], lr: float, steps: int) -> None:
    """Train `checkpoint` toward `targets` ("Qb:[fold]") and print the aggressive-move probabilities every few steps,
    scored as the evaluation scores them (`evaluation.evaluate.kuhn_strategy`)."""
    import torch

    from unstable.collector.demonstrations import supervised_step
    from unstable.evaluation.evaluate import kuhn_strategy, scoring_policy
    from unstable.games.kuhn import kuhn_information_sets
    from unstable.records import EnvSpec, Step

    torch.manual_seed(0)
    spec = EnvSpec("KuhnPoker-v0-single-train", 2, "qwen3-zs")
    policy = scoring_policy(checkpoint)
    infosets = {info.key: info for info in kuhn_information_sets(spec.env_id)}
    shown = [infosets[key] for key in ("Jb", "Qb", "Kb", "J", "Q", "K")]
    told = [
        supervised_step(
            Step(spec.env_id, infosets[key].env_player_id, 0, infosets[key].observation, move), spec, policy.tokenizer
        )
        for key, move in (target.split(":") for target in targets)
    ]
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=lr)
    for step in range(steps + 1):
        if step % max(1, steps // 8) == 0:
            strategy = kuhn_strategy(policy, spec, shown)
            print(f"step {step}:", {key: round(p, 3) for key, p in strategy.items()}, flush=True)
        loss = -sum((policy.forward(b).logprobs * b.completion_mask).sum() for b in policy.micro_batches(told))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def regularised_equilibrium(
    tau: float, anchor: dict[str, float] | None = None, iterations: int = 5000, damping: float = 0.05
) -> dict[str, float]:
    """The self-play fixed point of P(aggressive at I) = sigmoid(logit(anchor(I)) + gap(I) / tau), the anchor even
    play unless given (damped iteration from the anchor)."""
    anchor = anchor or {key: 0.5 for key in INFOSETS}
    strategy = dict(anchor)
    for _ in range(iterations):
        target = {key: _sigmoid(_logit(anchor[key]) + value_gap(strategy, key) / tau) for key in INFOSETS}
        strategy = {key: (1 - damping) * strategy[key] + damping * target[key] for key in INFOSETS}
    return strategy


def value_gap(strategy: dict[str, float], infoset: str) -> float:
    """Chips the aggressive move wins over the passive one at `infoset`, given it is reached (both seats playing
    `strategy`)."""
    aggressive, passive = strategy | {infoset: 1.0}, strategy | {infoset: 0.0}
    if infoset in FIRST_PLAYER_INFOSETS:
        gain = game_value(aggressive, strategy) - game_value(passive, strategy)
    else:
        gain = game_value(strategy, passive) - game_value(strategy, aggressive)
    reached = sum(_deal_reach(strategy, deal, infoset) for deal in itertools.permutations(CARDS, 2)) / 6
    return gain / reached if reached > 1e-12 else 0.0


def advantage_spread(strategy: dict[str, float]) -> float:
    """The standard deviation of the moves' advantages (chips) over the games `strategy` plays against itself, each
    move's advantage over its state's value with the deal known (as vines measure it)."""
    weight = square = 0.0
    for deal in itertools.permutations(CARDS, 2):
        for infoset in INFOSETS:
            reach = _deal_reach(strategy, deal, infoset)
            if reach < 1e-12:
                continue
            aggressive, passive = strategy | {infoset: 1.0}, strategy | {infoset: 0.0}
            gap = (deal_value(*deal, aggressive, aggressive) - deal_value(*deal, passive, passive)) / reach
            p = strategy[infoset]
            weight += reach
            square += reach * p * (1 - p) * gap**2
    return math.sqrt(square / weight)


def _deal_reach(strategy: dict[str, float], deal: tuple[str, str], infoset: str) -> float:
    """The probability that the deal's play reaches `infoset` (0 if its card is not the deal's)."""
    first, second = deal
    card, history = infoset[0], infoset[1:]
    if card != (first if infoset in FIRST_PLAYER_INFOSETS else second):
        return 0.0
    return {
        "": 1.0,
        "b": strategy[first],
        "c": 1 - strategy[first],
        "cb": (1 - strategy[first]) * strategy[second + "c"],
    }[history]


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-max(-50.0, min(50.0, x))))


def _logit(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    floor = commands.add_parser("floor", help="the least exploitability with given information sets played alike")
    floor.add_argument("--alike", nargs="+", default=["QK"], help="'QK' (cards) or 'Jc=Qc' (information sets)")
    floor.add_argument("--restarts", type=int, default=40)
    told = commands.add_parser("probe", help="supervised steps toward given moves; the probabilities as they go")
    told.add_argument("checkpoint")
    told.add_argument("--targets", nargs="+", default=["Qb:[fold]", "Kb:[call]"])
    told.add_argument("--lr", type=float, default=4e-4)
    told.add_argument("--steps", type=int, default=80)
    anchored = commands.add_parser("anchored", help="the regularised equilibrium's exploitability by temperature")
    anchored.add_argument("--taus", type=float, nargs="+", default=[1.0, 0.65, 0.5, 0.3, 0.2, 0.1])
    anchored.add_argument("--resets", type=int, default=0, help="then R-NaD's resets: the anchor moved to each one")
    args = parser.parse_args()
    if args.command == "floor":
        if args.restarts < 1:
            parser.error(f"--restarts must be at least 1, got {args.restarts}")
        try:
            slots = alike_slots(args.alike)
        except ValueError as exc:
            parser.error(str(exc))
        value, strategy = least_exploitable_alike(slots, args.restarts)
        print(f"least exploitability with {' and '.join(args.alike)} alike: {value:.4f}")
        print({key: round(p, 3) for key, p in strategy.items()})
    elif args.command == "anchored":
        for tau in args.taus:
            strategy = regularised_equilibrium(tau)
            spread = advantage_spread(strategy)
            print(
                f"tau {tau:g} chips: exploitability {float(exploitability(strategy)):.4f}, advantage spread "
                f"{spread:.3f} chips (anchor coefficient {tau / spread:.2f})",
                {key: round(p, 2) for key, p in strategy.items()},
            )
            for reset in range(1, args.resets + 1):
                strategy = regularised_equilibrium(tau, anchor=strategy)
                print(
                    f"tau {tau:g} chips, reset {reset}: exploitability {float(exploitability(strategy)):.4f}",
                    {key: round(p, 2) for key, p in strategy.items()},
                )
    else:
        probe(args.checkpoint, args.targets, args.lr, args.steps)


if __name__ == "__main__":
    main()
