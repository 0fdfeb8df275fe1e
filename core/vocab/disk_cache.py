"""Per-token flags that are costly to derive, kept on disk between processes.

Which tokens a tokenizer can emit (`members.covering`) takes one encode of every token's text:
1-2 s for a 150-260k vocabulary, paid again by every process (each example, each server, each
test worker) on its first boundary-corrected step. The answer depends only on the tokenizer, so
it is stored under the cache root (`$ENSEMBLE_LLM_CACHE`, else `~/.cache/ensemble-llm`), keyed
by a digest of everything it follows from: the tokenizer's full serialisation (vocabulary,
merges, normaliser, pre-tokenizer, added tokens) and the token table built from it. A stale or
damaged file can never be read as valid: a different tokenizer has a different key, and a file
of the wrong size or content is rebuilt. A cache that cannot be written costs only the rebuild.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

from ensemble_core.packaged import cache_root
from ensemble_core.vocab.tokens import TokenKind, TokenTable

_FORMAT = 1  # bump when what a stored flag means changes


def tokenizer_digest(tokenizer: Any, table: TokenTable) -> str | None:
    """A digest of a tokenizer and its token table (None for a tokenizer without a serialisable
    Rust backend: nothing is cached for it)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    digest = hashlib.sha256(backend.to_str().encode("utf-8"))
    digest.update(bytes(kind is TokenKind.SPECIAL for kind in table.kinds))
    digest.update(b"".join((spelled or b"\xff\xfe") + b"\x00" for spelled in table.token_bytes))
    digest.update(bytes([table.adds_dummy_prefix]))
    return digest.hexdigest()[:32]


def cached_flags(kind: str, tokenizer: Any, table: TokenTable, build: Callable[[], list[bool]]) -> list[bool]:
    """`build()` (one flag per token id), read from the disk cache when an earlier process of
    any program stored it for the same tokenizer, else built and stored."""
    digest = tokenizer_digest(tokenizer, table)
    if digest is None:
        return build()
    path = cache_root() / "tokenizers" / f"{kind}-v{_FORMAT}-{digest}.bin"
    try:
        stored = path.read_bytes()
    except OSError:
        stored = b""
    if len(stored) == len(table) and not stored.strip(b"\x00\x01"):
        return [value == 1 for value in stored]
    flags = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}.partial")
        staging.write_bytes(bytes(flags))
        os.replace(staging, path)  # atomic: a concurrent reader sees the whole file or none
    except OSError:
        pass  # a read-only or full cache: the flags are still right, only built again next time
    return flags
