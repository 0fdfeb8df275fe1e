"""Decoding methods, chosen by instance or by registry name (`Ensemble(..., method="single")`)."""

from ensemble_core.methods.base import (
    METHODS,
    Binding,
    Commit,
    DecodeState,
    Method,
    MethodRun,
    register,
    resolve_method,
)
from ensemble_core.methods.contrast import Contrastive
from ensemble_core.methods.safe import SAFE
from ensemble_core.methods.segment import SpecFuse
from ensemble_core.methods.single import Single
from ensemble_core.methods.span import SweetSpan
from ensemble_core.methods.token import GaC, UniTE

__all__ = [
    "METHODS",
    "SAFE",
    "Binding",
    "Commit",
    "Contrastive",
    "DecodeState",
    "GaC",
    "Method",
    "MethodRun",
    "Single",
    "SpecFuse",
    "SweetSpan",
    "UniTE",
    "register",
    "resolve_method",
]
