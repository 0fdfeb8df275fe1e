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
from dataclasses import dataclass, field
from typing import Any

from ensemble_core.ensemble import Ensemble
from ensemble_core.errors import ConfigError
from ensemble_core.members.base import Member
from ensemble_core.members.hf import HFMember, checked_member_name, stated_context_window
from ensemble_core.methods.base import METHODS, resolve_method

_SOURCE_KEYS = ("model", "name", "device", "dtype", "model_kwargs")


@dataclass(frozen=True)
class ModelSource:
    """One entry of `models=`: a model and how to load it.

    Users write a name (packaged name, Hub id or folder) or a dict with these keys, so each
    member can have its own GPU, dtype, revision, `trust_remote_code` or quantization config.
    """

    model: str
    name: str | None = None
    device: str | None = None
    dtype: str | None = None
    """None: the ensemble-wide `dtype`."""
    model_kwargs: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    kwargs_key: str = "{}"
    """`model_kwargs` as text: what makes two sources equal (a quantization config is an object)."""

    @classmethod
    def of(cls, entry: str | Mapping[str, Any], index: int) -> ModelSource:
        """A source from one `models=` entry, checked (names the entry and the fix)."""
        if isinstance(entry, str):
            entry = {"model": entry}
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"`models[{index}]` must be a model name or a dict such as "
                f"{{'model': 'Qwen/Qwen2.5-1.5B-Instruct', 'device': 'cuda:0'}}, but is {entry!r}."
            )
        unknown = sorted(set(entry) - set(_SOURCE_KEYS))
        if unknown:
            raise ConfigError(f"`models[{index}]` has unknown keys {unknown}; the keys are {list(_SOURCE_KEYS)}.")
        model = entry.get("model")
        if not isinstance(model, str) or not model:
            raise ConfigError(f"`models[{index}]` needs `model`: a packaged name, Hub id or folder, not {model!r}.")
        for key in ("name", "device", "dtype"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                raise ConfigError(f"`models[{index}].{key}` must be a string, but is {entry[key]!r}.")
        kwargs = entry.get("model_kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise ConfigError(
                f"`models[{index}].model_kwargs` must be a dict of `from_pretrained` keywords, e.g. "
                f"{{'revision': 'main', 'trust_remote_code': True}}, but is {kwargs!r}."
            )
        key = json.dumps(dict(kwargs), sort_keys=True, default=repr)
        return cls(model, entry.get("name"), entry.get("device"), entry.get("dtype"), dict(kwargs), key)

    @property
    def member_name(self) -> str:
        return checked_member_name(self.model, self.name)


@dataclass(frozen=True)
class EnsembleSpec:
    """What to load: the models (`ModelSource`s) and the method.

    Checked when made (names, method and its parameters), without loading anything.
    """

    models: tuple[ModelSource, ...]
    method: str
    method_params_json: str = "{}"
    device: str | None = None
    dtype: str = "auto"
    placement: str = "local"

    @classmethod
    def build(
        cls,
        models: Sequence[str | Mapping[str, Any]],
        method: str,
        method_params: Mapping[str, Any] | None = None,
        device: str | None = None,
        dtype: str = "auto",
        placement: str = "local",
    ) -> EnsembleSpec:
        """A checked spec. The front ends (adapters, `run`, `serve`) build theirs here, so the
        default configuration is one: `front_end_params` gives GaC, UniTE and SAFE
        `weights="auto"` unless weights are given (docs/guides/weights-and-calibration.md)."""
        if isinstance(models, (str, Mapping)) or not isinstance(models, Sequence) or not models:
            raise ConfigError(
                "`models` must be a non-empty list of model names (packaged names, Hub ids or folders) "
                f"or dicts with a `model` key, but is {models!r}."
            )
        sources = tuple(ModelSource.of(entry, index) for index, entry in enumerate(models))
        names = [source.member_name for source in sources]
        if len(set(names)) < len(names):
            raise ConfigError(
                f"`models` has two members named alike ({names}); list each model once, or give one a `name`."
            )
        if not isinstance(method, str):
            raise ConfigError(f"`method` must be a method name such as 'gac', but is {type(method).__name__}.")
        params = front_end_params(method, method_params)
        # an unknown method, bad parameters, a member count it cannot take, a role naming no
        # member or a weight too many fail now, not after loading
        resolve_method(method, params).check_members(names)
        try:
            params_json = json.dumps(params, sort_keys=True)
        except TypeError as error:
            raise ConfigError(f"`method_params` must hold plain values (numbers, strings, lists): {error}") from None
        ray_address(placement)  # an unknown placement fails now
        return cls(sources, method, params_json, device, dtype, placement)

    def load_members(self) -> list[Member]:
        """The members, loaded where `placement` says: in this process, or each in a Ray actor."""
        if self.placement == "local":
            return [HFMember.from_pretrained(source.model, **self._loading(source)) for source in self.models]
        from ensemble_core.members.ray_member import RayMember

        address = ray_address(self.placement)
        members = []
        for source in self.models:
            loading = self._loading(source)
            gpus = 1 if str(loading["device"] or "").startswith("cuda") else 0
            members.append(RayMember.from_pretrained(source.model, **loading, num_gpus=gpus, address=address))
        return members

    def _loading(self, source: ModelSource) -> dict[str, Any]:
        return {
            "device": source.device or self.device,
            "dtype": source.dtype or self.dtype,
            "name": source.name,
            "model_kwargs": dict(source.model_kwargs) or None,
        }

    @property
    def method_params(self) -> dict[str, Any]:
        return json.loads(self.method_params_json)

    def context_window(self) -> int:
        """The smallest model's window, read from the configs once (weights are not loaded)."""
        return _smallest_stated_window(tuple(source.model for source in self.models))

    @property
    def model_name(self) -> str:
        """The name the loaded ensemble will have (`Ensemble.model_name`), known without loading."""
        return f"{self.method}({'+'.join(source.member_name for source in self.models)})"


def front_end_params(method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """A method's parameters as the front ends use them: the user's, with `weights="auto"` for a
    method that finds weights (GaC, UniTE, SAFE) when none are given.

    Equal weights are the papers' setting and lose on our published slices; prompt-likelihood
    weights tie the best member there (docs/results/index.md). An explicit `"equal"` keeps them.
    """
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError(f"`method_params` must be a mapping of parameter names to values, but is {params!r}.")
    found = dict(params or {})
    cls = METHODS.get(method.lower()) if isinstance(method, str) else None
    if cls is not None and cls.finds_weights and "weights" not in found:
        found["weights"] = "auto"
    return found


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
