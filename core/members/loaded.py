"""Models and tokenizers `HFMember.from_pretrained` loaded in this process, shared while in use.

Two adapters over the same models with different methods (`ChatEnsemble(method="gac")` beside
`ChatEnsemble(method="safe")`), an evaluation that builds one member per configuration, or a
test suite that loads the same checkpoint in many modules would otherwise hold one copy of the
weights per load. Members never change a model's weights, and each member keeps its KV caches
in its own sessions, so members loaded with the same settings can share one model object (as
`HFMember(model, tokenizer, name=...)` already lets callers do by hand).

The cache holds weak references only: once no member holds a model (every one was closed or
dropped), its memory is freed as before and the next load reads it again.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_models: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_tokenizers: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def load_key(**settings: Any) -> str | None:
    """A key naming what a load depends on, or None when a setting has no stable spelling (an
    object in `model_kwargs`, e.g. a quantization config): such a load is never shared."""
    try:
        return json.dumps(settings, sort_keys=True, default=_plain)
    except TypeError:
        return None


def _plain(value: Any) -> str:
    if isinstance(value, str | int | float | bool) or value is None:
        return str(value)
    # torch dtypes and devices spell themselves; anything else may hide state a string loses
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "device"):
        return str(value)
    raise TypeError(f"{type(value).__name__} has no stable spelling")


def shared_model(key: str | None, load: Callable[[], T]) -> T:
    """The model loaded under `key` if a member still holds it, else `load()` (kept under `key`)."""
    return _shared(_models, key, load)


def shared_tokenizer(key: str | None, load: Callable[[], T]) -> T:
    """As `shared_model`, for tokenizers (the key includes any chat template set on them)."""
    return _shared(_tokenizers, key, load)


def _shared(cache: weakref.WeakValueDictionary[str, Any], key: str | None, load: Callable[[], T]) -> T:
    if key is None:
        return load()
    with _lock:  # two threads loading one model load it once (loads run one at a time)
        found = cache.get(key)
        if found is None:
            found = load()
            cache[key] = found
        return found
