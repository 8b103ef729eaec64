"""The model-backed agent: render the observation with a template, sample, extract the move."""

from __future__ import annotations

import time
from typing import Any, Protocol

from unstable.games.actions import extract_action
from unstable.games.agent import Agent
from unstable.games.templates import PromptTemplate
from unstable.records import Checkpoint, Decision, GenerationRequest, GenerationResult, mixed_seed


class GenerationClient(Protocol):
    """Anything that completes one request: an `InferenceServer`, a proxy to one living in a Ray actor, or an
    `InferenceClient` over several; `end_game` tells it a game ended (a router forgets it, a server ignores it)."""

    def generate(self, request: GenerationRequest) -> GenerationResult: ...

    def end_game(self, game: int) -> None: ...


class PolicyAgent(Agent):
    """Plays with the policy `checkpoint` served by `client`, recording tokens, behaviour log-probs and the
    sampling settings they were drawn with; its requests name `game`, the game it plays in (None: none). Given a
    `sampling_seed`, its n-th request carries the seed (`sampling_seed`, n), so its game repeats whatever else the
    engine serves (evaluation games); without one, it samples from the engine's stream."""

    def __init__(
        self,
        client: GenerationClient,
        checkpoint: Checkpoint,
        template: PromptTemplate,
        tokenizer: Any = None,
        game: int | None = None,
        sampling_seed: int | None = None,
    ):
        self.client = client
        self.checkpoint = checkpoint
        self.template = template
        self.tokenizer = tokenizer
        self.game = game
        self.sampling_seed = sampling_seed
        self.requests = 0
        self.name = checkpoint.uid

    def act(self, observation: str) -> Decision:
        """Sample a completion for the rendered observation and parse the move out of it."""
        prompt = self.template.render(observation, self.tokenizer)
        start = time.perf_counter()
        request = GenerationRequest(prompt, self.checkpoint, self.game, self._request_seed())
        result = self.client.generate(request)
        action, format_ok = extract_action(result.text)
        return Decision(
            action=action,
            raw_output=result.text,
            prompt=prompt,
            prompt_token_ids=result.prompt_token_ids,
            completion_token_ids=result.completion_token_ids,
            behaviour_logprobs=result.logprobs,
            format_ok=format_ok,
            checkpoint=result.served_by or self.checkpoint,  # the weights that sampled it, for its staleness
            generation_seconds=time.perf_counter() - start,
            temperature=result.temperature,
            top_p=result.top_p,
        )

    def _request_seed(self) -> int | None:
        """The next request's sampling seed: `sampling_seed` and the request's number mixed (`mixed_seed`)."""
        self.requests += 1
        return None if self.sampling_seed is None else mixed_seed(self.sampling_seed, self.requests)
