"""Optional dependencies: a missing one is an error that says which extra installs it."""

from __future__ import annotations

import importlib.util

from ensemble_core.errors import MissingPackageError


def require_extra(module: str, extra: str) -> None:
    """Raise `MissingPackageError` naming the pip command when `module` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise MissingPackageError(f"`{module}` is not installed; install it with: pip install 'ensemble-llm[{extra}]'")
