"""The one run configuration: a validated dataclass tree that YAML, the CLI and the form share.

Options are the flags of nlp-waseda/lbes (`src/es_config.py`, `src/lbes_config.py`) in
snake_case, plus ES Lab's own (engines, antithetic sampling, fitness shaping, schedule rate and
power). Every option name is unique across groups, so a configuration is always expressible
as flat `option: value` pairs plus `method: es | lbes`; the groups only organise the Python
side (`cfg.es.noise_std`).

Differences from the reference, on purpose:
- learning_rate may be 0 (the reference requires > 0): a run with lr 0 must leave the weights
  untouched, which the engine tests rely on.
- method-dependent defaults: with method lbes, n defaults to 8 and temperature to 1.0, as
  `LBESConfig` overrides them; they apply only to options the input does not give.
- options that only one method reads are refused under the other method instead of being
  silently ignored.

Modules, each one job: `fields` (how an option is declared and described), `schema` (the
groups and RunConfig), `coercion` (one value against its option), `rules` (checks across
options), `validation` (input to RunConfig or every problem), `yaml_io` (YAML in and out),
`errors`.
"""

from engine.config.errors import ConfigError, FieldError
from engine.config.fields import METHODS, FieldSpec
from engine.config.schema import (
    GROUP_TITLES,
    AlignmentConfig,
    DataConfig,
    EnsembleConfig,
    EsConfig,
    EvalConfig,
    LbesConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
    config_fields,
)
from engine.config.validation import flatten, scalar_errors
from engine.config.yaml_io import read_yaml

__all__ = [
    "GROUP_TITLES",
    "METHODS",
    "AlignmentConfig",
    "ConfigError",
    "DataConfig",
    "EnsembleConfig",
    "EsConfig",
    "EvalConfig",
    "FieldError",
    "FieldSpec",
    "LbesConfig",
    "LoggingConfig",
    "LoraConfig",
    "ModelConfig",
    "RewardConfig",
    "RunConfig",
    "SamplingConfig",
    "config_fields",
    "flatten",
    "read_yaml",
    "scalar_errors",
]
