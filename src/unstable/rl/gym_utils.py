"""Optional helpers to train `TorchTrainer` agents on gymnasium environments (discrete or continuous actions).

`make_vector_env` builds a vector env, `make_gym_agent` an MLP agent for its spaces, `GymCollector` steps it
and cuts the stream into episodes, `evaluate` scores an agent, and `train_gym` ties them into a training loop
driven by a `GymConfig` (usable with `unstable.rl.cli.run`). Needs `gymnasium` (imported lazily).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from unstable.rl.agent import Agent, AgentOutput
from unstable.rl.config import FloatRange, IntRange, TrainerConfig, knob
from unstable.rl.trainer import TorchTrainer

EVAL_MEAN_RETURN = "eval/mean_return"
EVAL_STD_RETURN = "eval/std_return"
EVAL_EPISODES = "eval/episodes"
EVAL_ENV_STEPS = "eval/env_steps"


@dataclass
class GymEpisode:
    """An episode (or a segment of one) of T actions, as the acting policy saw it."""

    observations: Tensor  # (T + 1, obs_size): every state visited, the last one included
    actions: Tensor  # (T,) long for discrete actions, (T, action_size) float for continuous ones
    rewards: Tensor  # (T,)
    action_lls: Tensor  # (T,) log-likelihood of each action under the acting policy
    terminated: bool  # ended in a terminal state (False: truncated or cut at a collection boundary)


class GymAgent(Agent):
    """An MLP policy over flat observations: categorical for `Discrete` actions, a diagonal Gaussian (with a
    learned, state-independent log std) in `[-1, 1]` units for `Box` actions.

    The state encoding is the observation concatenated with the last hidden layer, so the value function
    always sees the raw state as well as the policy's features.
    """

    def __init__(self, obs_size: int, action_size: int, discrete: bool, hidden_sizes: list[int], init_log_std: float):
        super().__init__()
        self.discrete = discrete
        layers: list[torch.nn.Module] = []
        for width_in, width_out in zip([obs_size, *hidden_sizes[:-1]], hidden_sizes):
            layers += [torch.nn.Linear(width_in, width_out), torch.nn.Tanh()]
        self.body = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(hidden_sizes[-1], action_size)
        torch.nn.init.orthogonal_(self.head.weight, gain=0.01)
        torch.nn.init.zeros_(self.head.bias)
        self.log_std = torch.nn.Parameter(torch.full((action_size,), init_log_std), requires_grad=not discrete)
        self.state_encoding_size = obs_size + hidden_sizes[-1]

    def encode_and_dist(self, observations: Tensor) -> tuple[Tensor, torch.distributions.Distribution]:
        """State encodings `(N, E)` and action distributions (batch shape `(N,)`) of `(N, obs_size)` states."""
        hidden = self.body(observations)  # (N, H)
        out = self.head(hidden)  # (N, action_size)
        if self.discrete:
            dist = torch.distributions.Categorical(logits=out)
        else:
            dist = torch.distributions.Independent(torch.distributions.Normal(out, self.log_std.exp()), 1)
        return torch.cat([observations, hidden], dim=-1), dist  # (N, E)

    def forward(self, episodes: list[GymEpisode]) -> list[AgentOutput]:
        """One pass over all episodes' states, split back per episode."""
        lengths = [ep.rewards.numel() for ep in episodes]
        observations = torch.cat([ep.observations for ep in episodes]).to(self.head.weight.device)  # (sum T+1, D)
        encodings, dist = self.encode_and_dist(observations)
        actions = torch.cat([_pad_last(ep.actions) for ep in episodes]).to(observations.device)  # (sum T+1, ...)
        lls = dist.log_prob(actions)  # (sum T+1,) the padded last action of each episode is dropped below
        outputs, start = [], 0
        for n in lengths:
            steps = slice(start, start + n)
            step_dist = _slice_categorical(dist, steps) if self.discrete else _slice_gaussian(dist, steps)
            outputs.append(AgentOutput(encodings[start : start + n + 1], lls[steps], step_dist))
            start += n + 1
        return outputs

    @torch.no_grad()
    def act(self, observations: np.ndarray, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """Actions `(N, ...)` and their log-likelihoods `(N,)` for a batch of observations."""
        obs = torch.as_tensor(observations, dtype=torch.float32, device=self.head.weight.device)
        _, dist = self.encode_and_dist(obs)
        if deterministic:
            actions = dist.probs.argmax(-1) if self.discrete else dist.base_dist.loc
        else:
            actions = dist.sample()
        return actions.cpu(), dist.log_prob(actions).cpu()


def _pad_last(actions: Tensor) -> Tensor:
    """`actions` with a copy of its first row appended, so it lines up with the T + 1 observations."""
    return torch.cat([actions, actions[:1]])


def _slice_categorical(dist: torch.distributions.Categorical, steps: slice) -> torch.distributions.Categorical:
    return torch.distributions.Categorical(logits=dist.logits[steps])


def _slice_gaussian(dist: torch.distributions.Independent, steps: slice) -> torch.distributions.Independent:
    normal = dist.base_dist
    return torch.distributions.Independent(torch.distributions.Normal(normal.loc[steps], normal.scale[steps]), 1)


def make_gym_agent(env: Any, hidden_sizes: list[int], init_log_std: float = -0.5) -> GymAgent:
    """A `GymAgent` for the (single) observation and action spaces of a gymnasium env or vector env."""
    import gymnasium as gym

    obs_space = getattr(env, "single_observation_space", env.observation_space)
    action_space = getattr(env, "single_action_space", env.action_space)
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(f"observation space must be a flat Box, got {obs_space}")
    if isinstance(action_space, gym.spaces.Discrete):
        return GymAgent(obs_space.shape[0], int(action_space.n), True, hidden_sizes, init_log_std)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return GymAgent(obs_space.shape[0], action_space.shape[0], False, hidden_sizes, init_log_std)
    raise ValueError(f"action space must be Discrete or a flat Box, got {action_space}")


def env_actions(env: Any, actions: Tensor) -> np.ndarray:
    """The agent's actions as the env takes them: ints, or `[-1, 1]` units clipped and scaled to the Box."""
    import gymnasium as gym

    space = getattr(env, "single_action_space", env.action_space)
    if isinstance(space, gym.spaces.Discrete):
        return actions.numpy()
    center, half_width = (space.high + space.low) / 2, (space.high - space.low) / 2
    return (center + half_width * np.clip(actions.numpy(), -1.0, 1.0)).astype(space.dtype)


def make_vector_env(env_id: str, num_envs: int, **kwargs: Any) -> Any:
    """A `SyncVectorEnv` of `num_envs` copies of `env_id` that resets finished envs in the same step."""
    import gymnasium as gym

    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


class GymCollector:
    """Steps a vector env (from `make_vector_env`) with an agent and cuts its transitions into `GymEpisode`s."""

    def __init__(self, envs: Any, seed: int) -> None:
        self.envs = envs
        self.obs, _ = envs.reset(seed=seed)
        self.env_steps = 0
        self.completed_returns: list[float] = []
        self._running_returns = np.zeros(envs.num_envs)
        self._partial: list[list[tuple[np.ndarray, Tensor, float, Tensor]]] = [[] for _ in range(envs.num_envs)]

    def collect(self, agent: GymAgent, num_steps: int) -> list[GymEpisode]:
        """Step every env `num_steps` times; the finished episodes plus each env's unfinished segment
        (terminated=False, continued by the next call)."""
        episodes = []
        for _ in range(num_steps):
            actions, lls = agent.act(self.obs)
            next_obs, rewards, terminated, truncated, info = self.envs.step(env_actions(self.envs, actions))
            self.env_steps += self.envs.num_envs
            self._running_returns += rewards
            for i in range(self.envs.num_envs):
                self._partial[i].append((self.obs[i], actions[i], float(rewards[i]), lls[i]))
                if terminated[i] or truncated[i]:
                    episodes.append(self._cut(i, info["final_obs"][i], bool(terminated[i])))
                    self.completed_returns.append(float(self._running_returns[i]))
                    self._running_returns[i] = 0.0
            self.obs = next_obs
        episodes += [self._cut(i, self.obs[i], False) for i in range(self.envs.num_envs) if self._partial[i]]
        return episodes

    def _cut(self, env_index: int, last_obs: np.ndarray, terminated: bool) -> GymEpisode:
        """Turn env `env_index`'s pending transitions into an episode ending in `last_obs`."""
        observations, actions, rewards, lls = zip(*self._partial[env_index])
        self._partial[env_index] = []
        return GymEpisode(
            observations=torch.as_tensor(np.stack([*observations, last_obs]), dtype=torch.float32),  # (T + 1, D)
            actions=torch.stack(actions),  # (T, ...)
            rewards=torch.tensor(rewards, dtype=torch.float32),  # (T,)
            action_lls=torch.stack(lls),  # (T,)
            terminated=terminated,
        )


def evaluate(env_id: str, agent: GymAgent, episodes: int, seed: int, deterministic: bool = True) -> dict[str, float]:
    """Mean and std of the undiscounted return of `episodes` full episodes (deterministic actions by default)."""
    import gymnasium as gym

    env = gym.make(env_id)
    returns, steps = [], 0
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            action, _ = agent.act(obs[None], deterministic)
            obs, reward, terminated, truncated, _ = env.step(env_actions(env, action)[0])
            total += float(reward)
            steps += 1
            done = terminated or truncated
        returns.append(total)
    env.close()
    return {
        EVAL_MEAN_RETURN: float(np.mean(returns)),
        EVAL_STD_RETURN: float(np.std(returns)),
        EVAL_EPISODES: float(episodes),
        EVAL_ENV_STEPS: float(steps),
    }


@dataclass
class GymConfig(TrainerConfig):
    """`TrainerConfig` plus the environment, collection and evaluation settings of `train_gym`."""

    env_id: str = knob("CartPole-v1", "Gymnasium id of the environment.")
    num_envs: int = knob(8, "Environments stepped together by the collector.")
    steps_per_collect: int = knob(
        128, "Vector steps per collection (num_envs times as many env steps).", IntRange(32, 512, log=True)
    )
    total_env_steps: int = knob(200_000, "Stop training after this many environment steps.")
    reward_scale: float = knob(1.0, "Multiply rewards by this before training (not in the reported returns).")
    hidden_sizes: list[int] = knob([64, 64], "Hidden layer widths of the agent's MLP.")
    init_log_std: float = knob(-0.5, "Initial log std of a continuous policy.", FloatRange(-2.0, 0.5))
    eval_interval: int = knob(5, "Train steps between evaluations.")
    eval_episodes: int = knob(10, "Episodes per evaluation.")
    stop_at_return: float | None = knob(None, "Stop once an evaluation's mean return reaches this (None: never).")


def train_gym(cfg: GymConfig) -> dict[str, float]:
    """Train a `GymAgent` on `cfg.env_id` until `total_env_steps`; returns the last evaluation's stats."""
    _seed_everything(cfg.seed)
    envs = make_vector_env(cfg.env_id, cfg.num_envs)
    agent = make_gym_agent(envs, cfg.hidden_sizes, cfg.init_log_std)
    trainer = TorchTrainer(cfg, agent)
    trainer.attempt_resume()
    collector = GymCollector(envs, seed=cfg.seed + 1000 * trainer.train_steps)
    if trainer.train_steps == 0:  # the untrained agent's score, as a baseline
        trainer.add_eval_stats(evaluate(cfg.env_id, agent, cfg.eval_episodes, seed=10_000 + cfg.seed))
    while trainer.total_env_steps < cfg.total_env_steps:
        for episode in collector.collect(agent, cfg.steps_per_collect):
            trainer.add_episode(episode, episode.rewards * cfg.reward_scale, episode.action_lls, episode.terminated)
        trainer.train_step()
        if trainer.train_steps % cfg.eval_interval == 0:
            trainer.add_eval_stats(evaluate(cfg.env_id, agent, cfg.eval_episodes, seed=10_000 + cfg.seed))
        trainer.maybe_checkpoint()
        reached = trainer.last_eval_stats.get(EVAL_MEAN_RETURN, -np.inf)
        if cfg.stop_at_return is not None and reached >= cfg.stop_at_return:
            break
    envs.close()
    return trainer.last_eval_stats


def _seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
