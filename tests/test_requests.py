"""Requests are named by stable handles; bad input of any shape is an `EnsembleError`.

In `generate_batch([A, B, C])`, when A finishes its rows are freed; B and C must keep THEIR OWN
state (Hedge weights, exits, traces, statistics), not inherit A's. Checked for every method:
each prompt of a batch whose prompts have different lengths and finish at different steps gets
exactly the text it gets alone. The members are `FakeMember`s around tiny float32 random
models (each node is a full forward of its ids, so batching cannot round differently), with an
end-of-text bias that ends prompts of different lengths at different steps.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ensemble_core import Ensemble
from ensemble_core.errors import EnsembleError
from ensemble_core.methods import SAFE, Contrastive, GaC, Single, SpecFuse, SweetSpan, UniTE
from ensemble_core.testing import FakeMember

PROMPTS = ["The", "A much longer prompt about rivers and the sea and", "Hello there, said", "1 2 3 4"]


def ending_member(tiny_member, arch: str, name: str) -> FakeMember:
    """A tiny random model whose end token wins once the text (prompt included) reaches a length
    that is a multiple of 13 bytes: every member sees the same text, so they agree on the end,
    and prompts of different lengths end at different steps."""
    member = tiny_member(arch)
    model, eos, table = member.model, member.end_token_id, member.table

    @functools.lru_cache(maxsize=4096)  # a pure function of the ids: the batch and each prompt alone ask alike
    def cached(ids: tuple[int, ...]) -> torch.Tensor:
        with torch.inference_mode():
            values = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            length = len(table.spell(ids))
            push = 50.0 if length > 40 and length % 13 == 0 else -50.0  # the end here, and only here
            values = values + push * torch.nn.functional.one_hot(torch.tensor(eos), values.shape[0])
        return values

    def logits(ids: list[int]) -> torch.Tensor:
        return cached(tuple(ids)).clone()

    return FakeMember(
        member.tokenizer, logits, name, eos_token_ids=sorted(member.eos_token_ids), width=member.logits_width
    )


METHODS = {
    "single": Single(),
    "gac": GaC(),
    "gate": GaC(threshold=0.2),
    "unite": UniTE(top_k=5),
    "safe": SAFE(draft_len=3, record=True),
    "sweetspan": SweetSpan(span_words=2),
    "specfuse-exit": SpecFuse(segment_tokens=4, exit_warmup=1),
    "specem-hedge": SpecFuse(segment_tokens=4, hedge_eta=2.0, exit=False),
    "contrastive": Contrastive(),
}


@pytest.mark.parametrize("boundary", ["correct", "retokenize"])
@pytest.mark.parametrize("name", list(METHODS))
def test_each_prompt_of_a_batch_gets_exactly_its_text_alone(name: str, boundary: str, tiny_member) -> None:
    members = [
        ending_member(tiny_member, "tiny-llama", "a"),
        ending_member(tiny_member, "tiny-qwen2", "b"),
        ending_member(tiny_member, "tiny-gemma3", "c"),
    ][: 2 if name == "contrastive" else 3]  # an expert and an amateur
    ensemble = Ensemble(members, method=METHODS[name], boundary=boundary)
    batch = ensemble.generate_batch(PROMPTS, max_new_tokens=24)
    steps = set()
    for prompt, batched in zip(PROMPTS, batch, strict=True):
        alone = ensemble.generate(prompt, max_new_tokens=24)
        assert batched.text == alone.text, prompt
        assert batched.token_ids == alone.token_ids
        assert batched.finish_reason == alone.finish_reason
        assert batched.stats.method_stats == alone.stats.method_stats  # per-request figures, nobody else's
        steps.add(alone.stats.steps)
    assert len(steps) > 1  # the prompts really finished at different steps


# ---------------------------------------------------------------------- bad input of any shape

TEXT = st.text(max_size=12) | st.sampled_from(["\ud800x", ""])
ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True) | TEXT | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "wizard", 3]), "content": TEXT | ANY}
)
PROMPT = TEXT | st.lists(MESSAGE, max_size=3) | ANY
SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "max_new_tokens": st.integers(-3, 6) | st.floats(allow_nan=True) | st.just(2**70),
        "temperature": st.floats(-1, 3) | st.just(math.nan) | TEXT,
        "top_p": st.floats(-1, 2) | st.just(math.nan),
        "seed": st.integers(-(2**70), 2**70) | st.none(),
        "stop": st.lists(TEXT | st.integers(), max_size=2) | TEXT | st.none(),
        "max_tokens": st.integers(1, 3),
    },
)


@pytest.fixture(scope="module")
def quick(load_tokenizer) -> Ensemble:
    def script(text: str) -> dict[str, float]:
        return {" ok": 0.5, "<eos>": 0.5} if len(text) < 400 else {"<eos>": 1.0}

    member = FakeMember.scripted(load_tokenizer("smollm2-135m-instruct"), "quick", script)
    return Ensemble([member, FakeMember.scripted(member.tokenizer, "other", script)], method="gac")


@pytest.mark.parametrize(
    "options",
    [{"temperature": 1.0, "seed": 2**70}, {"temperature": math.inf}, {"max_new_tokens": True}, {"stop": ["\udc00"]}],
)
def test_settings_that_once_slipped_through_are_config_errors(quick: Ensemble, options) -> None:
    from ensemble_core.errors import ConfigError

    with pytest.raises(ConfigError):
        quick.generate("Hi", **options)


@pytest.mark.parametrize(
    "inputs",
    [
        {"reply_prefix": "\ud800x"},  # hypothesis found it: the tokenizers library's TypeError leaked
        {"tools": [{"type": "function", "function": {"name": "f\ud800", "parameters": {"type": "object"}}}]},
    ],
    ids=["reply_prefix", "tools"],
)
def test_a_lone_surrogate_outside_the_prompt_is_a_config_error(quick: Ensemble, inputs) -> None:
    from ensemble_core.errors import ConfigError

    with pytest.raises(ConfigError, match="surrogate"):
        quick.generate([{"role": "user", "content": "Hi"}], **inputs)


def test_random_prompts_and_settings_raise_nothing_but_ensemble_errors(quick: Ensemble) -> None:
    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(PROMPT, SETTINGS, st.none() | ANY, ANY | st.just(""))
    def check(prompt, options, tools, reply_prefix) -> None:
        try:
            result = quick.generate(prompt, tools=tools, reply_prefix=reply_prefix, **options)
        except EnsembleError:
            return
        assert isinstance(result.text, str)
        assert result.usage.completion_tokens >= 1 or result.finish_reason == "stop"

    check()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SpecFuse(segment_tokens=0), "`segment_tokens` has to be a positive integer, but is 0"),
        (lambda: SweetSpan(span_words=0), "`span_words` has to be a positive integer, but is 0"),
        (lambda: SweetSpan(max_span_tokens=0), "`max_span_tokens` has to be a positive integer, but is 0"),
        (lambda: GaC(weights=[1, math.nan]), "`weights` must all be >= 0"),
        (lambda: SAFE(confident_drafts=0), r"`confident_drafts` has to be in \(0, 1\]"),
    ],
)
def test_parameter_errors_name_the_parameter(make, message) -> None:
    from ensemble_core.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        make()
