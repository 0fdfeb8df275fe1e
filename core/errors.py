"""One exception root for everything ensemble-llm raises on purpose.

Tree (catch `EnsembleError` to catch them all)::

    EnsembleError
    ├── ConfigError(ValueError)          a parameter or input is invalid; raised before model work
    │   └── UnknownNameError(KeyError)   a packaged model, member, method or device name is unknown
    ├── MissingPackageError(ImportError) an optional package or a model package is not installed
    ├── ModelLoadError(OSError)          a model or tokenizer could not be loaded or prepared
    ├── TemplateError(ValueError)        a conversation cannot be rendered by a member's chat template
    ├── GenerationError(RuntimeError)    generation cannot go on (e.g. no member can spell the text)
    └── ClosedError(RuntimeError)        the ensemble (or member) was closed and holds no models

Warnings are `EnsembleWarning(UserWarning)` (e.g. a member that sits out because it cannot
spell the committed text).

Errors raised by transformers, tokenizers or torch while loading are wrapped in
`ModelLoadError` (the original stays available as `__cause__`), so callers never need to
know which library failed.
"""

from __future__ import annotations


class EnsembleError(Exception):
    """Root of every error ensemble-llm raises on purpose."""


class ConfigError(EnsembleError, ValueError):
    """A parameter or an input is invalid; the message names it, its value and the fix."""


class UnknownNameError(ConfigError, KeyError):
    """A name (packaged model, member, method, device) is not one we know."""

    def __str__(self) -> str:
        # KeyError would otherwise wrap the message in quotes.
        return str(self.args[0]) if self.args else ""


class MissingPackageError(EnsembleError, ImportError):
    """A package is not installed; the message carries the exact install command."""


class ModelLoadError(EnsembleError, OSError):
    """A model or tokenizer could not be loaded, converted or cached."""


class TemplateError(EnsembleError, ValueError):
    """A conversation cannot be rendered into a prompt by a member's chat template."""


class GenerationError(EnsembleError, RuntimeError):
    """Generation cannot go on; the message says why (no input check could have foreseen it)."""


class MemberFailedError(GenerationError):
    """A member failed mid-generation: its forward raised (out of memory, a driver error) or its
    host died (a Ray actor). Only the requests of that batch are lost; `member` names it."""

    def __init__(self, message: str, member: str):
        super().__init__(message)
        self.member = member

    @classmethod
    def of(cls, member: str, error: BaseException) -> MemberFailedError:
        """The failure of `member`'s forward, said for the person who must act on it."""
        if _out_of_memory(error):
            advice = (
                "it ran out of memory: serve fewer rows at once (--max-batch), shorter replies, "
                "or give it a GPU of its own"
            )
        else:
            advice = f"{type(error).__name__}: {error}"
        lost = "The requests it was serving are lost."
        return cls(f"Member {member!r} failed in its forward pass ({advice}). {lost}", member)


def _out_of_memory(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or "out of memory" in str(error)


class ClosedError(EnsembleError, RuntimeError):
    """The ensemble or member was closed (`close()`): its models are released."""


class EnsembleWarning(UserWarning):
    """Something worth knowing that does not stop generation (shown once per member)."""
