"""Device and dtype arguments, checked before any weights are read."""

from __future__ import annotations

import torch

from ensemble_core.errors import ConfigError

DTYPES: dict[str, torch.dtype | str] = {
    "auto": "auto",
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None`/"auto" -> the first CUDA device if there is one, else the CPU.

    Raises:
        ConfigError: the string is not a device, or names one this machine does not have.
    """
    if device is None or device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ConfigError(
            f"`device` must be a torch device such as 'cpu', 'cuda' or 'cuda:1', but is {device!r} ({error})."
        ) from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"`device` is {device!r}, but CUDA is not available on this machine; use device='cpu'.")
        index = 0 if resolved.index is None else resolved.index
        if index >= count:
            raise ConfigError(
                f"`device` is {device!r}, but this machine has {count} CUDA device(s): cuda:0..cuda:{count - 1}."
            )
        return torch.device("cuda", index)
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"`device` is {device!r}, but MPS is not available on this machine; use device='cpu'.")
    if resolved.type not in {"cpu", "cuda", "mps", "xpu"}:
        raise ConfigError(f"`device` type {resolved.type!r} is not supported; use 'cpu', 'cuda[:N]' or 'mps'.")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    """A dtype name or `torch.dtype` -> what `from_pretrained(dtype=...)` takes ("auto" kept)."""
    if dtype is None:
        return "auto"
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ConfigError(f"`dtype` must be a floating-point type, but is {dtype}.")
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise ConfigError(f"`dtype` must be one of {sorted(DTYPES)} or a torch.dtype, but is {dtype!r}.")
