"""An `Ensemble` from model names, loaded once per process and shared.

The framework adapters are built from plain settings (`models=[...]`, `method=...`) and must
construct in microseconds (LangChain and LlamaIndex create chat models freely: per request,
per test, inside `with_structured_output`). So they keep a `EnsembleSpec` and load on first
use through `shared_ensemble`, which hands every adapter with the same spec the SAME loaded
ensemble: one copy of the weights, and one lock, so their requests queue instead of running
over each other's caches.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ensemble_core.ensemble import Ensemble
from ensemble_core.errors import ConfigError
from ensemble_core.members.hf import HFMember
from ensemble_core.methods.base import resolve_method


@dataclass(frozen=True)
class EnsembleSpec:
    """What to load: model names (packaged names, Hub ids or folders) and the method.

    Checked when made (names, method and its parameters), without loading anything.
    """

    models: tuple[str, ...]
    method: str
    method_params_json: str = "{}"
    device: str | None = None
    dtype: str = "auto"

    @classmethod
    def build(
        cls,
        models: Sequence[str],
        method: str,
        method_params: Mapping[str, Any] | None = None,
        device: str | None = None,
        dtype: str = "auto",
    ) -> EnsembleSpec:
        if isinstance(models, str) or not isinstance(models, Sequence) or not models:
            raise ConfigError(
                "`models` must be a non-empty list of model names (packaged names, Hub ids or folders), "
                f"but is {models!r}."
            )
        for index, name in enumerate(models):
            if not isinstance(name, str) or not name:
                raise ConfigError(f"`models[{index}]` must be a non-empty string, but is {name!r}.")
        if len(set(models)) < len(models):
            raise ConfigError(f"`models` lists a model twice ({list(models)}); list each model once.")
        if not isinstance(method, str):
            raise ConfigError(f"`method` must be a method name such as 'gac', but is {type(method).__name__}.")
        resolve_method(method, method_params)  # unknown method / bad parameters fail now, not at first use
        try:
            params_json = json.dumps(dict(method_params or {}), sort_keys=True)
        except TypeError as error:
            raise ConfigError(f"`method_params` must hold plain values (numbers, strings, lists): {error}") from None
        return cls(tuple(models), method, params_json, device, dtype)

    @property
    def method_params(self) -> dict[str, Any]:
        return json.loads(self.method_params_json)


_loaded: dict[EnsembleSpec, Ensemble] = {}
_loading = threading.Lock()


def shared_ensemble(spec: EnsembleSpec) -> Ensemble:
    """The process's ensemble for `spec`, loading its models on the first call."""
    with _loading:
        if spec not in _loaded:
            members = [HFMember.from_pretrained(name, device=spec.device, dtype=spec.dtype) for name in spec.models]
            _loaded[spec] = Ensemble(members, method=spec.method, method_params=spec.method_params)
        return _loaded[spec]
