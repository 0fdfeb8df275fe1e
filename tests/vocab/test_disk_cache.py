"""Per-token flags kept on disk: built once for a tokenizer, read back by later processes,
never read for another tokenizer, rebuilt when damaged, and harmless when unwritable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ensemble_core.members.covering import LeafIndex, _emittable
from ensemble_core.packaged import CACHE_ENV_VAR
from ensemble_core.vocab import token_table
from ensemble_core.vocab.disk_cache import cached_flags


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    return tmp_path / "tokenizers"


def _counting(flags: list[bool]) -> tuple[list[int], Callable[[], list[bool]]]:
    calls = [0]

    def build() -> list[bool]:
        calls[0] += 1
        return list(flags)

    return calls, build


def test_flags_are_built_once_then_read_back_exactly(cache: Path, load_tokenizer) -> None:
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    table = token_table(tokenizer)
    truth = _emittable(tokenizer, table)
    assert not all(truth) and any(truth)  # special tokens at least are not emittable
    calls, build = _counting(truth)
    assert cached_flags("emittable", tokenizer, table, build) == truth
    assert cached_flags("emittable", tokenizer, table, build) == truth
    assert calls[0] == 1
    [stored] = cache.iterdir()
    assert stored.stat().st_size == len(table)
    # What the covering reads through the cache is what it would build without it.
    assert LeafIndex(tokenizer, table)._ids.tolist() == sorted(
        (t for t, ok in enumerate(truth) if ok), key=lambda t: table.token_bytes[t]
    )


def test_another_tokenizer_never_reads_these_flags(cache: Path, load_tokenizer) -> None:
    first, second = load_tokenizer("smollm2-135m-instruct"), load_tokenizer("gpt2")
    cached_flags("emittable", first, token_table(first), lambda: [True] * len(token_table(first)))
    calls, build = _counting([False] * len(token_table(second)))
    assert cached_flags("emittable", second, token_table(second), build) == [False] * len(token_table(second))
    assert calls[0] == 1 and len(list(cache.iterdir())) == 2


@pytest.mark.parametrize("damage", [b"\x01\x00", None], ids=["truncated", "not-flags"])
def test_a_damaged_file_is_rebuilt_and_replaced(cache: Path, load_tokenizer, damage: bytes | None) -> None:
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    table = token_table(tokenizer)
    flags = [token % 3 == 0 for token in range(len(table))]
    cached_flags("emittable", tokenizer, table, lambda: flags)
    [stored] = cache.iterdir()
    stored.write_bytes(damage if damage is not None else b"\x02" * len(table))
    calls, build = _counting(flags)
    assert cached_flags("emittable", tokenizer, table, build) == flags
    assert calls[0] == 1 and stored.read_bytes() == bytes(flags)


def test_an_unwritable_cache_still_gives_the_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, load_tokenizer
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache root is a file, so nothing can be written under it")
    monkeypatch.setenv(CACHE_ENV_VAR, str(blocker))
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    table = token_table(tokenizer)
    flags = [True] * len(table)
    assert cached_flags("emittable", tokenizer, table, lambda: flags) == flags
