"""An `Ensemble` from model names, loaded once per process and shared.

The framework adapters are built from plain settings (`models=[...]`, `method=...`) and must
construct in microseconds (LangChain and LlamaIndex create chat models freely: per request,
per test, inside `with_structured_output`). So they keep a `EnsembleSpec` and load on first
use through `shared_ensemble`, which hands every adapter with the same spec the SAME loaded
ensemble: one copy of the weights, and one lock, so their requests queue instead of running
over each other's caches.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ensemble_core.ensemble import Ensemble
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.members.hf import HFMember, checked_member_name, stated_context_window
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
    placement: str = "local"

    @classmethod
    def build(
        cls,
        models: Sequence[str],
        method: str,
        method_params: Mapping[str, Any] | None = None,
        device: str | None = None,
        dtype: str = "auto",
        placement: str = "local",
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
        # an unknown method, bad parameters, a member count it cannot take, a role naming no
        # member or a weight too many fail now, not after loading
        resolve_method(method, method_params).check_members([checked_member_name(m, None) for m in models])
        try:
            params_json = json.dumps(dict(method_params or {}), sort_keys=True)
        except TypeError as error:
            raise ConfigError(f"`method_params` must hold plain values (numbers, strings, lists): {error}") from None
        ray_address(placement)  # an unknown placement fails now
        return cls(tuple(models), method, params_json, device, dtype, placement)

    def load_members(self) -> list[Member]:
        """The members, loaded where `placement` says: in this process, or each in a Ray actor."""
        if self.placement == "local":
            return [HFMember.from_pretrained(name, device=self.device, dtype=self.dtype) for name in self.models]
        from ensemble_core.members.ray_member import RayMember

        gpus = 1 if self.device and self.device.startswith("cuda") else 0
        address = ray_address(self.placement)
        return [
            RayMember.from_pretrained(name, device=self.device, dtype=self.dtype, num_gpus=gpus, address=address)
            for name in self.models
        ]

    @property
    def method_params(self) -> dict[str, Any]:
        return json.loads(self.method_params_json)

    def context_window(self) -> int:
        """The smallest model's window, read from the configs once (weights are not loaded)."""
        return _smallest_stated_window(self.models)

    @property
    def model_name(self) -> str:
        """The name the loaded ensemble will have (`Ensemble.model_name`), known without loading."""
        return f"{self.method}({'+'.join(self.models)})"


def ray_address(placement: str) -> str | None:
    """The Ray cluster a placement names: "ray" (`$RAY_ADDRESS`, else a local Ray) or a
    "ray://host:port" client address; None for "local".

    Raises:
        ConfigError: anything else.
    """
    if placement == "local" or placement == "ray":
        return None
    if isinstance(placement, str) and placement.startswith("ray://"):
        return placement
    raise ConfigError(
        f"`placement` must be 'local' (members in this process), 'ray' (each member in a Ray actor; "
        f"the cluster at $RAY_ADDRESS, else a local Ray) or a 'ray://host:port' address, but is {placement!r}."
    )


@functools.cache
def _smallest_stated_window(models: tuple[str, ...]) -> int:
    return min((w for name in models if (w := stated_context_window(name))), default=0)


_MODEL_SETTINGS = ("method", "method_params", "device", "dtype", "placement")


def adapter_source(
    models: Sequence[str] | None,
    ensemble: Ensemble | None,
    settings: Mapping[str, Any],
    given: set[str],
) -> EnsembleSpec | None:
    """Check an adapter's `models=` / `ensemble=` pair: the spec to load, or None for `ensemble`.

    Args:
        settings: the adapter's method, method_params, device, dtype and placement.
        given: the names of the adapter fields the user set (the rest are defaults).

    Raises:
        ConfigError: neither or both given, or model settings given along with an `ensemble`.
    """
    if (models is None) == (ensemble is None):
        raise ConfigError("give exactly one of `models=[...]` (model names) or `ensemble=` (a loaded Ensemble)")
    if ensemble is not None:
        if not isinstance(ensemble, Ensemble):
            raise ConfigError(f"`ensemble` must be an ensemble_core.Ensemble, but is {type(ensemble).__name__}")
        if set(_MODEL_SETTINGS) & given:
            raise ConfigError(
                "`method`, `method_params`, `device`, `dtype` and `placement` apply to `models=`; "
                "an `ensemble=` already has its members and method"
            )
        return None
    return EnsembleSpec.build(models, *(settings[name] for name in _MODEL_SETTINGS))


_loaded: dict[EnsembleSpec, Ensemble] = {}
_loading = threading.Lock()


def shared_ensemble(spec: EnsembleSpec) -> Ensemble:
    """The process's ensemble for `spec`, loading its models on the first call.

    It stays loaded until it is closed (`Ensemble.close()`, or `release_shared(spec)`), which
    frees its models and drops it from this cache; the next call loads it again.
    """
    with _loading:
        if spec not in _loaded:
            ensemble = Ensemble(spec.load_members(), method=spec.method, method_params=spec.method_params)
            ensemble.on_close(lambda: _forget(spec, ensemble))
            _loaded[spec] = ensemble
        return _loaded[spec]


def release_shared(spec: EnsembleSpec) -> bool:
    """Close the shared ensemble of `spec` (for every adapter using it); False if none was loaded."""
    with _loading:
        ensemble = _loaded.get(spec)
    if ensemble is None:
        return False
    ensemble.close()
    return True


def loaded_specs() -> list[EnsembleSpec]:
    """The specs whose ensembles are loaded in this process now."""
    with _loading:
        return list(_loaded)


def _forget(spec: EnsembleSpec, ensemble: Ensemble) -> None:
    with _loading:
        if _loaded.get(spec) is ensemble:
            del _loaded[spec]
