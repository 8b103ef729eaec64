"""Collection when every env call waits on a service: games/s of TicTacToe between random agents whose env sleeps
`--sleep-ms` (50) in each call (as TextArena's Debate waits for its jury of remote models), with 1 game in flight and
with `--games` (32), each game on its own thread as the collector plays them (`play_episode`, its env's own chance).
Each env call used to run under one process-wide lock, so such games waited in line: the ratio was about 1.

    python benchmarks/env_concurrency.py [--games 32] [--sleep-ms 50] [--seconds 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from recorded import settings

ROOT = Path(__file__).resolve().parent.parent


class WaitingEnv:
    """A TextArena env whose every call first waits `seconds` (a service's answer)."""

    def __init__(self, env, seconds: float):
        self.env = env
        self.seconds = seconds

    def __getattr__(self, name):
        attribute = getattr(self.env, name)
        if name not in ("reset", "step", "get_observation", "close"):
            return attribute

        def waiting(*args, **kwargs):
            time.sleep(self.seconds)
            return attribute(*args, **kwargs)

        return waiting


def games_per_second(in_flight: int, seconds: float) -> float:
    """Games finished per second by `in_flight` threads, each playing games one after another for `seconds`."""
    from unstable.agents.scripted import RandomAgent
    from unstable.games import play_episode
    from unstable.records import EnvSpec

    spec = EnvSpec("TicTacToe-v0-train", 2, "qwen3-zs")
    finished = [0] * in_flight
    deadline = time.perf_counter() + seconds

    def play(thread: int) -> None:
        game = 0
        while time.perf_counter() < deadline:
            seed = thread * 100_000 + game
            record = play_episode(spec, {0: RandomAgent(seed), 1: RandomAgent(seed + 1)}, seed)
            finished[thread] += not record.failed
            game += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=play, args=(i,)) for i in range(in_flight)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(finished) / (time.perf_counter() - start)


def main() -> None:
    """Time 1 and `--games` games in flight, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=32, help="games in flight of the second measurement")
    parser.add_argument("--sleep-ms", type=float, default=50.0, help="each env call's wait")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each measurement plays")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "env_concurrency.json"))
    args = parser.parse_args()
    from unstable.games import episode

    make_env = episode.make_env
    episode.make_env = lambda env_id: WaitingEnv(make_env(env_id), args.sleep_ms / 1000)
    rates = {n: games_per_second(n, args.seconds) for n in (1, args.games)}
    result = {
        "settings": settings(args),
        "games_per_s": {str(n): rate for n, rate in rates.items()},
        "ratio": rates[args.games] / rates[1],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"{'games in flight':<18}{'games/s':>10}")
    for n, rate in rates.items():
        print(f"{n:<18}{rate:>10.2f}")
    print(f"ratio {args.games} / 1: {result['ratio']:.1f}x (env calls wait {args.sleep_ms:.0f} ms each)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
