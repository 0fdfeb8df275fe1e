"""ensemble-llm core: decode-time ensembles of local LLMs with different tokenizers.

Public API::

    from ensemble_core import Ensemble, HFMember
    from ensemble_core.methods import Single
"""

from ensemble_core.ensemble import Ensemble
from ensemble_core.errors import (
    ClosedError,
    ConfigError,
    EnsembleError,
    EnsembleWarning,
    GenerationError,
    MemberFailedError,
    MissingPackageError,
    ModelLoadError,
    TemplateError,
    UnknownNameError,
)
from ensemble_core.members.base import Member
from ensemble_core.members.hf import HFMember
from ensemble_core.members.ray_member import RayMember
from ensemble_core.results import GenerationResult, GenerationStats, MemberStats, MemberUsage, StreamChunk, Usage

__version__ = "0.1.0"
"""The release (pyproject.toml reads it from here, so there is one place to change)."""

__all__ = [
    "ClosedError",
    "ConfigError",
    "Ensemble",
    "EnsembleError",
    "EnsembleWarning",
    "GenerationError",
    "GenerationResult",
    "GenerationStats",
    "HFMember",
    "Member",
    "MemberFailedError",
    "MemberStats",
    "MemberUsage",
    "MissingPackageError",
    "ModelLoadError",
    "RayMember",
    "StreamChunk",
    "TemplateError",
    "UnknownNameError",
    "Usage",
    "__version__",
]
