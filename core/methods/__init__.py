"""Decoding methods, chosen by instance or by registry name (`Ensemble(..., method="single")`)."""

from ensemble_core.methods.base import METHODS, Commit, DecodeState, Method, MethodRun, register, resolve_method
from ensemble_core.methods.single import Single

__all__ = ["METHODS", "Commit", "DecodeState", "Method", "MethodRun", "Single", "register", "resolve_method"]
