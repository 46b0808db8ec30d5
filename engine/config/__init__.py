"""The run configuration (engine/config/schema.py), under its public names."""

from engine.config.schema import (
    ConfigError,
    EsConfig,
    FieldError,
    FieldSpec,
    LbesConfig,
    RunConfig,
    SamplingConfig,
    config_fields,
)

__all__ = ["ConfigError", "EsConfig", "FieldError", "FieldSpec", "LbesConfig", "RunConfig",
           "SamplingConfig", "config_fields"]
