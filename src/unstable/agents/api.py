"""Opponents served by any OpenAI-compatible chat-completions endpoint (OpenRouter, vLLM, llama.cpp, ...).

The key is never stored: `APISettings.api_key_env` names the environment variable that holds it, read when a
request is sent, so neither settings nor agents can leak it through a repr, a log line or an error message.
Redirects are not followed: the key goes to `base_url` and nowhere else (urllib would carry it to any host).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
import urllib.error
import urllib.parse
import urllib.request

from pydantic import Field, field_validator

from unstable.games.actions import extract_action
from unstable.games.agent import Agent
from unstable.records import Decision
from unstable.settings import Settings

log = logging.getLogger(__name__)

BASE_URL_ENV = "UNSTABLE_API_BASE_URL"
DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
SYSTEM_PROMPT = (
    "You are playing a text game. Read the rules and the current state, then give your move exactly as the game "
    "writes moves, either inside \\boxed{} (e.g. \\boxed{[4]}) or as [move]."
)


class APIOpponentError(RuntimeError):
    """An API opponent could not get a usable completion; the message names the model, the endpoint and the
    last status or error, never the key."""


class APISettings(Settings):
    """How to reach the chat-completions endpoint; the key itself lives only in the environment."""

    base_url: str = Field(
        default_factory=lambda: os.environ.get(BASE_URL_ENV, DEFAULT_BASE_URL),
        validate_default=True,  # the environment's value is checked too
        description=f"Endpoint root; '/chat/completions' is appended. Default: ${BASE_URL_ENV}, else OpenRouter.",
    )
    api_key_env: str = Field(
        "UNSTABLE_API_KEY",
        description="NAME of the environment variable holding the key; unset or empty sends no Authorization.",
    )
    timeout_s: float = Field(30.0, gt=0, description="Socket timeout of one request, in seconds.")
    max_retries: int = Field(3, ge=0, description="Retries after a connection error, a timeout, HTTP 429 or 5xx.")
    backoff_s: float = Field(1.0, ge=0, description="Wait before the first retry, doubled for each further one.")
    temperature: float = Field(0.7, ge=0, description="Sampling temperature sent with every request.")
    max_tokens: int = Field(512, gt=0, description="Completion length limit sent with every request.")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{value!r} is not an http(s) URL (the endpoint root, from ${BASE_URL_ENV})")
        return value

    @classmethod
    def from_env(cls) -> APISettings:
        """Settings whose environment-dependent defaults (the base URL) are read now."""
        return cls()


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect, so the Authorization header never reaches a host other than `base_url`'s; the
    redirect then surfaces as an HTTPError with its 3xx status."""

    def redirect_request(self, req, fp, code, msg, headers, newurl) -> None:
        """No new request: the caller sees the redirect itself."""
        return None


_OPENER = urllib.request.build_opener(_RefuseRedirects)


def _retryable(status: int) -> bool:
    """Rate limiting and server errors may pass; any other HTTP error will not."""
    return status == 429 or status >= 500


def _content(body: bytes) -> str:
    """`choices[0].message.content` of a chat-completions response ('' when the model sent no text)."""
    return json.loads(body)["choices"][0]["message"]["content"] or ""


class APIAgent(Agent):
    """A fixed opponent played by `model` behind the endpoint of `settings`; its moves carry no tokens."""

    def __init__(self, model: str, settings: APISettings):
        self.name = model
        self.model = model
        self.settings = settings

    def __repr__(self) -> str:
        return f"APIAgent(model={self.model!r}, base_url={self.settings.base_url!r})"

    def act(self, observation: str) -> Decision:
        """Ask the model for a move and extract it from the reply (`format_ok` False when none is marked)."""
        start = time.perf_counter()
        content = self.complete(observation)
        action, format_ok = extract_action(content)
        return Decision(action, raw_output=content, format_ok=format_ok, generation_seconds=time.perf_counter() - start)

    def complete(self, observation: str) -> str:
        """The model's reply to `observation`, retrying transient failures with exponential backoff."""
        request = self._request(observation)
        last = "no attempt"
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                log.warning("API opponent %s: %s; retry %d/%d", self.model, last, attempt, self.settings.max_retries)
                time.sleep(self.settings.backoff_s * 2 ** (attempt - 1))
            try:
                with _OPENER.open(request, timeout=self.settings.timeout_s) as response:
                    body = response.read()
            except urllib.error.HTTPError as error:
                error.close()
                last = f"HTTP {error.code}"
                if 300 <= error.code < 400:
                    location = error.headers.get("Location")
                    raise self._error(
                        f"{last} redirect to {location} not followed: the key goes only to base_url"
                    ) from None
                if not _retryable(error.code):
                    raise self._error(last) from None
                continue
            except (OSError, http.client.HTTPException) as error:
                last = f"{type(error).__name__}: {getattr(error, 'reason', error)}"
                continue
            return self._parse(body)
        raise self._error(f"{last} after {self.settings.max_retries + 1} attempts")

    def _request(self, observation: str) -> urllib.request.Request:
        """The POST for one observation, with the key (if set) read from the environment now."""
        payload = {
            "model": self.model,
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": observation}],
            "temperature": self.settings.temperature,
            "max_tokens": self.settings.max_tokens,
        }
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.settings.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = self.settings.base_url.rstrip("/") + "/chat/completions"
        return urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")

    def _parse(self, body: bytes) -> str:
        """The reply text, or an APIOpponentError for a body that is not a chat completion."""
        try:
            return _content(body)
        except (ValueError, LookupError, TypeError) as error:
            raise self._error(f"malformed response ({type(error).__name__})") from None

    def _error(self, detail: str) -> APIOpponentError:
        """An error naming the model, the endpoint and `detail`."""
        return APIOpponentError(f"API opponent {self.model!r} at {self.settings.base_url}: {detail}")
