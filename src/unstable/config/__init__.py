"""Run configuration: YAML validated into nested pydantic models, one per component."""

from unstable.config.schema import ConfigError, RunConfig, load_config, validate_config

__all__ = ["ConfigError", "RunConfig", "load_config", "validate_config"]
