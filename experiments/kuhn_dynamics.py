"""Kuhn Poker's vine recipe in miniature: a table of 12 logits learns by mirror self-play with the recipe's
credit (vines, a Monte Carlo Q per action), z-scored advantages, the k3 KL anchor and Adam, so that what the
learning dynamics alone do to the last iterate can be measured in seconds, without a language model; and the
variants that isolate each of those choices, down to magnetic mirror descent per information set (`--mmd`).

What it keeps of `examples/kuhn-poker-tiny-vines.yaml`: every decision of a self-play game gets `rollouts` vines
(its own move and the vines' are continued to the end by the current policy, the deal known), each move is
credited with the mean return of its group's moves that chose the same action (`BaselineByGroup(by_action)`),
the batch's credits are z-scored (`NormalizeRewardsByEnv`), the loss is REINFORCE plus `anchor` x the k3 estimate
of KL to even play on the sampled moves, one Adam step per batch of `batch` moves, and the learning rate follows
the schedule. What it drops: the language model's shared weights (each information set has its own logit here,
so the Queen and the King are never tied) and its token-level details. The logits' learning rate is not the
model's: pick the one whose policy moves as fast as the model's did (0.1-0.3 in probability per 150 updates).

    python experiments/kuhn_dynamics.py --lr 0.03 --anchor 0.1 --seeds 8               # the recipe, anchor 0.1
    python experiments/kuhn_dynamics.py --mmd --lr 0.1 --anchor 0.1 --batch 1024 --seeds 8

Two of the model's traits can be put back: `--tie T` (with `--mmd-weights`: each step on one card's logit moves the
other cards' logits at the same betting by T times as much, as shared weights generalise between prompts that differ
by one token) and `--lag L` (the moves sampled by the policy of L updates before, as an asynchronous learner's are).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections import deque

from unstable.games.kuhn import CARDS, INFOSETS, exploitability

Move = tuple[str, int, float, int]  # (information set, aggressive 0/1, credit, its group: the state it was drawn in)
ENDS = ("cc", "bc", "cbc", "bf", "cbf")  # the finished betting sequences (f = fold)


def play_out(history: str, deal: tuple[str, str], probs: dict[str, float], rng: random.Random) -> float:
    """Chips the first player wins from `history` on (a string of c/b), both seats sampling from `probs`."""
    showdown = 1 if CARDS.index(deal[0]) > CARDS.index(deal[1]) else -1
    while True:
        if history == "cc":
            return showdown
        if history in ("bc", "cbc"):  # a call
            return 2 * showdown
        if history == "bf":
            return 1
        if history == "cbf":
            return -1
        key = _infoset(history, deal)
        aggressive = rng.random() < probs[key]
        history += _letter(history, aggressive)


def _infoset(history: str, deal: tuple[str, str]) -> str:
    """The acting player's card and the betting so far (`unstable.games.kuhn`'s keys)."""
    return deal[len(history) % 2] + history


def _letter(history: str, aggressive: bool) -> str:
    """The move's letter: call or fold facing a bet, else bet or check."""
    if history.endswith("b"):
        return "c" if aggressive else "f"
    return "b" if aggressive else "c"


def collect(
    probs: dict[str, float], batch: int, rollouts: int, rng: random.Random, state_baseline: bool = False
) -> list[Move]:
    """`batch` moves: every decision of self-play games, each with its `rollouts` vines, credited with the mean
    return of its group's moves that chose the same action (less the group's mean return with `state_baseline`)."""
    moves: list[Move] = []
    groups = 0
    while len(moves) < batch:
        deal = tuple(rng.sample(CARDS, 2))
        history = ""
        while history not in ENDS:
            key = _infoset(history, deal)
            sign = 1 if len(history) % 2 == 0 else -1  # the acting player's chips
            group = []
            for _ in range(rollouts + 1):
                aggressive = rng.random() < probs[key]
                chips = play_out(history + _letter(history, aggressive), deal, probs, rng)
                group.append((int(aggressive), sign * chips))
            baseline = statistics.fmean(r for _, r in group) if state_baseline else 0.0
            for action in (0, 1):
                returns = [r for a, r in group if a == action]
                if returns:
                    q = statistics.fmean(returns) - baseline
                    moves += [(key, action, q, groups) for _ in returns]
            groups += 1
            history += _letter(history, bool(group[0][0]))  # the game goes on with its own move
    return moves[:batch]


class Adam:
    """torch.optim.Adam's update for a dict of scalars."""

    def __init__(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.betas, self.eps, self.t = betas, eps, 0
        self.m = {k: 0.0 for k in INFOSETS}
        self.v = {k: 0.0 for k in INFOSETS}

    def step(self, params: dict[str, float], grads: dict[str, float], lr: float) -> None:
        self.t += 1
        b1, b2 = self.betas
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            m_hat, v_hat = self.m[k] / (1 - b1**self.t), self.v[k] / (1 - b2**self.t)
            params[k] -= lr * m_hat / (math.sqrt(v_hat) + self.eps)


def lr_factor(step: int, steps: int, schedule: str) -> float:
    """The recipe's schedules: constant, or cosine from 1 at the first update to 0 at the last."""
    if schedule == "constant":
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * step / max(1, steps - 1)))


def tie_cards(logits: dict[str, float], before: dict[str, float], tie: float) -> None:
    """Each logit's change since `before` added `tie` times to the other cards' logits at the same betting."""
    changes = {key: logits[key] - before[key] for key in INFOSETS}
    for key, change in changes.items():
        for card in CARDS:
            if card != key[0]:
                logits[card + key[1:]] += tie * change


def train(args: argparse.Namespace, seed: int) -> list[float]:
    """One run; the exploitability every `args.every` updates (the first at the start)."""
    rng = random.Random(seed)
    logits = {key: 0.0 for key in INFOSETS}  # even play, as the random-move warm start
    optimizer = Adam()
    curve, recent = [], deque(maxlen=args.lag + 1)  # the last lag + 1 policies, the oldest first
    for step in range(args.steps + 1):
        probs = {key: 1 / (1 + math.exp(-x)) for key, x in logits.items()}
        if step % args.every == 0:
            curve.append(float(exploitability(probs)))
        if step == args.steps:
            return curve
        recent.append(probs)
        sampler = recent[0]  # the policy of `lag` updates before (or the first)
        moves = collect(sampler, args.batch, args.rollouts, rng, args.state_baseline)
        lr = args.lr * lr_factor(step, args.steps, args.schedule)
        if args.mmd:
            mmd_step(logits, moves, lr, args.anchor, args.by_reach)
        elif args.mmd_weights:
            gradients = mmd_weight_gradients(probs, moves, args.eta, args.anchor, args.uncontested_magnet, sampler)
            before = dict(logits)
            optimizer.step(logits, gradients, lr)
            tie_cards(logits, before, args.tie)
        elif args.mmd_target:
            optimizer.step(logits, mmd_target_gradients(logits, probs, moves, args.eta, args.anchor), lr)
        elif args.sgd:
            for key, grad in pg_gradients(args, logits, probs, moves).items():
                logits[key] -= lr * grad
        else:
            optimizer.step(logits, pg_gradients(args, logits, probs, moves), lr)
    return curve


def pg_gradients(
    args: argparse.Namespace, logits: dict[str, float], probs: dict[str, float], moves: list[Move]
) -> dict[str, float]:
    """The recipe's loss's gradient in each logit: REINFORCE on the (z-scored) credits plus `anchor` x the k3 KL
    estimate's (or, `--reverse-kl`, the exact KL to even play's), each move's over p(1 - p) with `--natural`."""
    credits = [credit for _, _, credit, _ in moves]
    mean = 0.0 if args.state_baseline else statistics.fmean(credits)
    std = (statistics.pstdev(credits) or 1.0) if args.z_score else 1.0
    grads = {key: 0.0 for key in INFOSETS}
    for key, action, credit, _ in moves:
        p = probs[key]
        dlogp = action - p  # d log pi(action) / d logit
        if args.reverse_kl:  # d/dlogit of KL(pi || even play)
            kl_grad = p * (1 - p) * logits[key]
        else:  # d/dlogit of the k3 estimate (ref/pi - 1 - log(ref/pi)) on the sampled move, ref = 0.5
            kl_grad = (1 - 0.5 / (p if action else 1 - p)) * dlogp
        grad = -(credit - mean) / std * dlogp + args.anchor * kl_grad
        if args.natural:  # the Fisher's inverse: a step in the logit the size of the credit
            grad /= max(p * (1 - p), 1e-3)
        grads[key] += grad / len(moves)
    return grads


def mmd_target_gradients(
    logits: dict[str, float], probs: dict[str, float], moves: list[Move], eta: float, alpha: float
) -> dict[str, float]:
    """The gradient in each logit of the cross-entropy from each visited information set's magnetic mirror descent
    target (`mmd_step`'s new policy, from the batch's gap) to the policy, one term per move: an optimizer step
    toward the target rather than onto it, as a language model's learner would take."""
    by_infoset: dict[str, list[list[float]]] = {}
    for key, action, credit, _ in moves:
        by_infoset.setdefault(key, [[], []])[action].append(credit)
    grads = {key: 0.0 for key in INFOSETS}
    for key, (passive, aggressive) in by_infoset.items():
        if passive and aggressive:
            gap = statistics.fmean(aggressive) - statistics.fmean(passive)
            target = 1 / (1 + math.exp(-(logits[key] + eta * gap) / (1 + alpha * eta)))
            grads[key] = (probs[key] - target) * (len(passive) + len(aggressive)) / len(moves)
    return grads


def mmd_weight_gradients(
    probs: dict[str, float],
    moves: list[Move],
    eta: float,
    alpha: float,
    uncontested_magnet: bool = False,
    sampler: dict[str, float] | None = None,
) -> dict[str, float]:
    """The gradient of `unstable.algorithms.mmd`'s loss in each logit, as the language model's learner computes it:
    the moves pooled by what their player saw (the information set, the model's prompt), each move's action
    credited with its mean return there, the mirror-descent target over the distinct moves sampled (from their
    sampling probabilities, those credits and the magnet, even play), the set's loss its moves x the cross-entropy
    from that target; a set where one move only was sampled is left out (its target is unknown), or with
    `uncontested_magnet` takes the magnet's step alone, the gap taken as 0 (`uncontested="magnet"`). The target
    starts from the `sampler`'s probabilities (the moves' recorded log-probs; default `probs`, the policy now)."""
    sampler = probs if sampler is None else sampler
    step_size = alpha * eta
    pooled: dict[str, dict[int, list[float]]] = {}
    for key, action, credit, _ in moves:
        pooled.setdefault(key, {}).setdefault(action, []).append(credit)
    grads = {key: 0.0 for key in INFOSETS}
    for key, by_action in pooled.items():
        p, mu = probs[key], sampler[key]
        if len(by_action) < 2:
            if uncontested_magnet:
                keep = 1 / (1 + step_size)
                up, down = mu**keep * 0.5 ** (1 - keep), (1 - mu) ** keep * 0.5 ** (1 - keep)
                grads[key] += sum(map(len, by_action.values())) * (p - up / (up + down)) / len(moves)
            continue
        exponents = {
            a: (math.log(mu if a else 1 - mu) + eta * statistics.fmean(c) + step_size * math.log(0.5)) / (1 + step_size)
            for a, c in by_action.items()
        }
        top = max(exponents.values())
        total = sum(math.exp(x - top) for x in exponents.values())
        target = math.exp(exponents[1] - top) / total
        size = sum(map(len, by_action.values()))
        grads[key] += size * (p - target) / len(moves)
    return grads


def mmd_step(logits: dict[str, float], moves: list[Move], eta: float, alpha: float, by_reach: bool = False) -> None:
    """Magnetic mirror descent (Sokota et al. 2022) on each visited information set, its magnet even play: the
    logit moves by eta x the sampled gap between the aggressive and the passive move's mean credit, then shrinks
    toward 0 by 1 / (1 + alpha x eta); each information set counts once, however often it was reached (with
    `by_reach`, its step in proportion to its moves in the batch)."""
    by_infoset: dict[str, list[list[float]]] = {}
    for key, action, credit, _ in moves:
        by_infoset.setdefault(key, [[], []])[action].append(credit)
    for key, (passive, aggressive) in by_infoset.items():
        if passive and aggressive:
            gap = statistics.fmean(aggressive) - statistics.fmean(passive)
            step = eta * (len(passive) + len(aggressive)) * len(INFOSETS) / len(moves) if by_reach else eta
            logits[key] = (logits[key] + step * gap) / (1 + alpha * step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="updates")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=64, help="moves per update")
    parser.add_argument("--rollouts", type=int, default=7, help="vines per decision")
    parser.add_argument("--anchor", type=float, default=0.5, help="the KL anchor's coefficient (--mmd: alpha)")
    parser.add_argument("--schedule", choices=("constant", "cosine"), default="cosine")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--every", type=int, default=150)
    parser.add_argument("--state-baseline", action="store_true", help="credit Q(a) less the group's mean return")
    parser.add_argument("--no-z-score", dest="z_score", action="store_false", help="credits in chips")
    parser.add_argument("--sgd", action="store_true", help="plain gradient steps on the logits, not Adam")
    parser.add_argument("--reverse-kl", action="store_true", help="the anchor as KL(pi || even), exact")
    parser.add_argument("--natural", action="store_true", help="each move's gradient over p(1 - p)")
    parser.add_argument("--by-reach", action="store_true", help="--mmd's step in proportion to the visits")
    parser.add_argument("--mmd", action="store_true", help="magnetic mirror descent per information set, not Adam")
    parser.add_argument("--mmd-target", action="store_true", help="Adam on the cross-entropy to --mmd's target")
    parser.add_argument("--mmd-weights", action="store_true", help="Adam on unstable.algorithms.mmd's loss")
    parser.add_argument(
        "--uncontested-magnet", action="store_true", help="--mmd-weights: uncontested=magnet (a set with one move)"
    )
    parser.add_argument("--eta", type=float, default=1.0, help="--mmd-target's mirror step")
    parser.add_argument("--tie", type=float, default=0.0, help="--mmd-weights: a card's step moves the others' by T x")
    parser.add_argument("--lag", type=int, default=0, help="moves sampled by the policy L updates before")
    args = parser.parse_args()
    if args.lag < 0:
        parser.error(f"--lag must be 0 or more updates, got {args.lag}")
    ends = []
    for seed in range(args.seeds):
        curve = train(args, seed)
        ends.append(curve[-1])
        print(f"seed {seed}: " + " / ".join(f"{x:.3f}" for x in curve))
    under = sum(end < 0.05 for end in ends)
    print(f"end: mean {statistics.fmean(ends):.3f}, worst {max(ends):.3f}, under 0.05 in {under} of {len(ends)}")


if __name__ == "__main__":
    main()
