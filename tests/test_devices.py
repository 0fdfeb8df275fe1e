"""Where things live: the combining device, union maps moved once, distributions moved once.

No GPU here, so placement is checked with torch's "meta" device (tensors with a device and a
shape but no data): what moves where, and how often. `scripts/gpu_check.py` runs every method
on a real GPU, and on a GPU and the CPU mixed.
"""

from __future__ import annotations

import pytest
import torch
from conftest import packaged_member

from ensemble_core import Ensemble
from ensemble_core.members.contract import Continuations, MemberVocab
from ensemble_core.methods import SAFE, GaC
from ensemble_core.methods.combine import Combiner
from ensemble_core.methods.token import union_for

META = torch.device("meta")
NAMES = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct")


def on_device(vocab: MemberVocab, device: str) -> MemberVocab:
    """The same member facts, declared on another device."""
    return MemberVocab(vocab.name, vocab.table, vocab.eos_ids, vocab.width, torch.device(device), vocab.encode)


def test_distributions_are_combined_on_the_reference_members_device() -> None:
    qwen, smol = (packaged_member(n) for n in NAMES)
    assert Ensemble([qwen, smol], method=GaC()).combining_device == qwen.vocab.device
    gated = Ensemble([qwen, smol], method=GaC(threshold=0.5, primary="smol"))
    assert gated.combining_device == smol.vocab.device
    binding = SAFE(drafter="smol").bind([on_device(qwen.vocab, "cuda:0"), on_device(smol.vocab, "cuda:1")])
    assert binding.members[binding.reference].device == torch.device("cuda:1")  # the drafter's device


def test_union_maps_move_once_per_device_and_stay() -> None:
    vocabs = [packaged_member(n).vocab for n in NAMES]
    union = union_for(vocabs)
    first = Combiner(union, vocabs, [0.5, 0.5], META)
    again = Combiner(union, vocabs, [0.5, 0.5], META)  # a second generation on the same device
    for placed, reused in zip(first.maps, again.maps, strict=True):
        assert placed.to_union.device == META and placed.first_id.device == META
        assert placed is reused  # moved once, then the same tensors
    assert all(m.to_union.device.type == "cpu" for m in union.maps)  # the originals stay where they were


def test_each_distribution_moves_to_the_combining_device_once_per_step(monkeypatch) -> None:
    vocabs = [packaged_member(n).vocab for n in NAMES]
    combiner = Combiner(union_for(vocabs), vocabs, [0.5, 0.5], META)
    moves: list[torch.device] = []
    original = torch.Tensor.to

    def counting(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if result.device != self.device:
            moves.append(result.device)
        return result

    monkeypatch.setattr(torch.Tensor, "to", counting)
    distributions = {m: Continuations(torch.softmax(torch.randn(v.width), -1)) for m, v in enumerate(vocabs)}
    step = combiner.step(distributions)
    assert moves == [META, META]  # one move per member distribution, nothing else
    assert all(d.device == META for d in step.raw.values())


@pytest.mark.parametrize("device", ["cuda:3", "banana"])
def test_a_device_this_machine_lacks_is_refused_before_loading(device) -> None:
    from ensemble_core import HFMember
    from ensemble_core.errors import ConfigError

    with pytest.raises(ConfigError, match="device"):
        HFMember.from_pretrained("smollm2-135m-instruct", device=device)
