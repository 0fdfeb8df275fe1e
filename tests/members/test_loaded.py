"""Members loaded alike share one model in memory, and only while some member holds it."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from ensemble_core import Ensemble, HFMember
from ensemble_core.members.loaded import load_key


@pytest.fixture(scope="module")
def folder(tiny_member, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight checkpoint as a user's folder."""
    target = tmp_path_factory.mktemp("tiny-llama")
    member = tiny_member("tiny-llama")
    member.model.save_pretrained(target)
    member.tokenizer.save_pretrained(target)
    return target


def test_two_loads_of_one_checkpoint_share_its_model_and_write_alike(folder: Path) -> None:
    first = HFMember.from_pretrained(str(folder), dtype="float32", device="cpu", name="a")
    second = HFMember.from_pretrained(str(folder), dtype="float32", device="cpu", name="b")
    assert first.model is second.model and first.tokenizer is second.tokenizer
    assert first.name == "a" and second.name == "b"  # each member is its own, over one copy
    twins = Ensemble([first, second], method="gac").generate("The river", max_new_tokens=6)
    alone = Ensemble([first], method="single").generate("The river", max_new_tokens=6)
    assert twins.token_ids["a"] == twins.token_ids["b"] == alone.token_ids["a"]


def test_other_settings_load_another_copy(folder: Path) -> None:
    base = HFMember.from_pretrained(str(folder), dtype="float32", device="cpu")
    other_dtype = HFMember.from_pretrained(str(folder), dtype="bfloat16", device="cpu")
    other_kwargs = HFMember.from_pretrained(
        str(folder), dtype="float32", device="cpu", model_kwargs={"use_cache": True}
    )
    templated = HFMember.from_pretrained(str(folder), dtype="float32", device="cpu", chat_template="{{ messages }}")
    assert len({id(m.model) for m in (base, other_dtype, other_kwargs)}) == 3
    assert templated.model is base.model  # a template belongs to the tokenizer...
    assert templated.tokenizer is not base.tokenizer  # ...which is then its own
    assert templated.tokenizer.chat_template == "{{ messages }}" != base.tokenizer.chat_template


def test_a_model_no_member_holds_is_freed_and_loaded_again(folder: Path) -> None:
    first = HFMember.from_pretrained(str(folder), dtype="float32", device="cpu")
    watched = weakref.ref(first.model)
    second = HFMember.from_pretrained(str(folder), dtype="float32", device="cpu")
    first.close()
    gc.collect()
    assert watched() is second.model  # still held by the other member
    second.close()
    gc.collect()
    assert watched() is None  # nothing holds it: its memory is free
    again = HFMember.from_pretrained(str(folder), dtype="float32", device="cpu")
    assert again.model is not None and again.model is not watched()


def test_settings_without_a_stable_spelling_are_never_shared() -> None:
    class QuantizationConfig:  # an object whose state a string would not capture
        bits = 4

    assert load_key(source="x", options={"quantization_config": QuantizationConfig()}) is None
    assert load_key(source="x", options={"attn_implementation": "sdpa"}) == load_key(
        options={"attn_implementation": "sdpa"}, source="x"
    )
