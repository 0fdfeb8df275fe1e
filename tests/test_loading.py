"""`EnsembleSpec`: what the front ends (adapters, `run`, `serve`) load, with which defaults."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ensemble_core import ConfigError, HFMember
from ensemble_core.loading import EnsembleSpec


def test_methods_that_find_weights_default_to_auto_and_others_are_left_alone() -> None:
    assert EnsembleSpec.build(["a", "b"], "gac").method_params == {"weights": "auto"}
    assert EnsembleSpec.build(["a", "b"], "safe", {"drafter": "b"}).method_params == {"drafter": "b", "weights": "auto"}
    assert EnsembleSpec.build(["a", "b"], "unite", {"weights": [1, 3]}).method_params == {"weights": [1, 3]}
    assert EnsembleSpec.build(["a", "b"], "gac", {"weights": "equal"}).method_params == {"weights": "equal"}
    assert EnsembleSpec.build(["a", "b"], "sweetspan").method_params == {}  # numbers only: no rule to default to
    assert EnsembleSpec.build(["a", "b"], "contrastive").method_params == {}
    assert EnsembleSpec.build(["a"], "single").method_params == {}


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"model": "a", "gpu": 1}], "unknown keys \\['gpu'\\]"),
        ([{"name": "a"}], "needs `model`"),
        ([{"model": "a", "dtype": torch.float32}], "`models\\[0\\].dtype` must be a string"),
        ([{"model": "a", "model_kwargs": "revision=main"}], "model_kwargs` must be a dict"),
        (["org/a", "other/a"], "named alike"),  # both members would be called "a"
        ([3], "`models\\[0\\]` must be a model name or a dict"),
        ("a", "non-empty list"),
    ],
)
def test_bad_entries_are_named_before_anything_loads(models, message) -> None:
    with pytest.raises(ConfigError, match=message):
        EnsembleSpec.build(models, "single" if len(models) == 1 else "gac")


def test_each_entry_loads_with_its_own_dtype_name_and_from_pretrained_keywords(
    tiny_member: Callable[[str], HFMember], tmp_path: Path
) -> None:
    folders = {}
    for name in ("tiny-llama", "tiny-qwen2"):
        member = tiny_member(name)
        folders[name] = tmp_path / name
        member.model.save_pretrained(folders[name])
        member.tokenizer.save_pretrained(folders[name])
    entries = [
        {"model": str(folders["tiny-llama"]), "name": "small", "dtype": "float32"},
        {"model": str(folders["tiny-qwen2"]), "model_kwargs": {"attn_implementation": "eager"}},
    ]
    spec = EnsembleSpec.build(entries, "safe", {"drafter": "small"}, device="cpu", dtype="bfloat16")
    assert spec.model_name == "safe(small+tiny-qwen2)"
    assert spec == EnsembleSpec.build(entries, "safe", {"drafter": "small"}, device="cpu", dtype="bfloat16")
    small, qwen = spec.load_members()
    try:
        assert (small.name, small.model.dtype) == ("small", torch.float32)  # its own dtype
        assert (qwen.name, qwen.model.dtype) == ("tiny-qwen2", torch.bfloat16)  # the ensemble's
        assert qwen.model.config._attn_implementation == "eager"  # its from_pretrained keywords
        assert small.model.config._attn_implementation != "eager"
    finally:
        small.close()
        qwen.close()
