"""Run configuration: YAML validated into nested pydantic models."""

from unstable.config.schema import ConfigError, RunConfig, load_config, validate_config

__all__ = ["ConfigError", "RunConfig", "load_config", "validate_config"]
