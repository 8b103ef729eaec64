"""Games: TextArena adapter, prompt templates, action extraction and the plain `play_episode` function."""

from unstable.games.actions import extract_action
from unstable.games.episode import play_episode
from unstable.games.registry import available_env_ids, validate_env_id
from unstable.games.templates import TEMPLATES, PromptTemplate, get_template

__all__ = [
    "TEMPLATES",
    "PromptTemplate",
    "available_env_ids",
    "extract_action",
    "get_template",
    "play_episode",
    "validate_env_id",
]
