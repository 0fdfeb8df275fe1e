"""The Ensemble on tiny float32 models: batching, stop strings, streaming, seeds, errors."""

from __future__ import annotations

import pytest

from ensemble_core import Ensemble, HFMember
from ensemble_core.errors import ConfigError, ModelLoadError, TemplateError, UnknownNameError
from ensemble_core.methods import Single
from reference import endless, text_greedy_generate

PROMPTS = ["The", "A much longer prompt about rivers and their", "Hello there, said"]


@pytest.fixture
def llama(tiny_member) -> Ensemble:
    return Ensemble([endless(tiny_member("tiny-llama"))], method=Single(), boundary="retokenize")


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_batch_equals_one_at_a_time_equals_uncached_greedy(arch: str, tiny_member) -> None:
    member = tiny_member(arch)
    ensemble = Ensemble([member], method="single", boundary="retokenize")
    batch = ensemble.generate_batch(PROMPTS, max_new_tokens=20)
    for prompt, batched in zip(PROMPTS, batch, strict=True):
        alone = ensemble.generate(prompt, max_new_tokens=20)
        assert batched.token_ids == alone.token_ids
        assert batched.text == alone.text
        assert (
            alone.token_ids[member.name]
            == text_greedy_generate(member, member.render(prompt).ids, 20)[: len(alone.token_ids[member.name])]
        )


def test_stop_string_cuts_text_even_inside_a_token(llama: Ensemble) -> None:
    full = llama.generate("The", max_new_tokens=30)
    data = full.data
    stop = data[len(data) // 2 : len(data) // 2 + 3].decode("utf-8", errors="ignore") or data[-2:].decode()
    stopped = llama.generate("The", max_new_tokens=30, stop=[stop, "never-appears"])
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.index(stop)]
    assert stop not in stopped.text


def test_stream_concatenates_to_the_generated_text(llama: Ensemble) -> None:
    chunks = list(llama.stream("Hello there, said", max_new_tokens=25, stop=["zzz"]))
    final = chunks[-1]
    assert final.result is not None and final.finish_reason == final.result.finish_reason
    assert all(c.result is None for c in chunks[:-1])
    assert (
        "".join(c.text for c in chunks)
        == final.result.text
        == llama.generate("Hello there, said", max_new_tokens=25).text
    )


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(llama: Ensemble) -> None:
    kwargs = dict(max_new_tokens=15, temperature=1.0, top_p=0.9, seed=11)
    first = llama.generate("The", **kwargs)
    assert llama.generate("The", **kwargs).text == first.text
    assert llama.generate_batch(["Hello there, said", "The"], **kwargs)[1].text == first.text
    other = {llama.generate("The", **{**kwargs, "seed": s}).text for s in range(4)}
    assert len(other) > 1


def test_usage_and_stats_count_what_happened(llama: Ensemble) -> None:
    member = llama.members[0]
    result = llama.generate("The", max_new_tokens=12)
    assert result.finish_reason == "length"
    assert result.usage.prompt_tokens == len(member.render("The").ids)
    assert result.usage.completion_tokens == 12 == result.stats.steps
    assert result.usage.counted_by == member.name
    stats = result.stats.members[member.name]
    assert stats.forwards == 12 and stats.own_tokens == 12 and stats.reencoded_tokens == 0


def test_single_picks_the_named_member_and_others_never_run(tiny_member) -> None:
    llama, qwen = tiny_member("tiny-llama"), endless(tiny_member("tiny-qwen2"))
    ensemble = Ensemble([llama, qwen], method=Single(member="tiny-qwen2"))
    result = ensemble.generate("The", max_new_tokens=5)
    assert list(result.stats.members) == ["tiny-qwen2"]
    assert result.token_ids["tiny-qwen2"] == Ensemble([qwen]).generate("The", max_new_tokens=5).token_ids["tiny-qwen2"]
    assert result.stats.method_stats.steps == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 0}, "`max_new_tokens` has to be a positive integer, but is 0"),
        ({"max_new_tokens": -3}, "`max_new_tokens` has to be a positive integer, but is -3"),
        ({"temperature": -0.1}, r"`temperature` has to be a finite number >= 0"),
        ({"top_p": 0.0}, r"`top_p` has to be in \(0, 1\]"),
        ({"seed": -1}, r"`seed` has to be an integer in \[0, 2\*\*64\) or None"),
        ({"stop": [""]}, "`stop` must hold non-empty strings"),
        ({"stop": 5}, "`stop` has to be a string or a list of strings"),
        ({"max_tokens": 5}, "`max_tokens` is not a generation setting; known settings: max_new_tokens"),
    ],
)
def test_bad_generation_settings_are_named(llama: Ensemble, kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        llama.generate("The", **kwargs)


def test_bad_prompts_and_members_are_rejected_before_any_forward(tiny_member) -> None:
    member = tiny_member("tiny-gemma3")  # Gemma's tokenizer has no chat template
    calls = []
    hook = member.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        ensemble = Ensemble([member])
        with pytest.raises(ConfigError, match="empty list"):
            ensemble.generate_batch([])
        with pytest.raises(TemplateError, match="no chat template"):
            ensemble.generate([{"role": "user", "content": "hi"}])
        with pytest.raises(TemplateError, match="no chat template"):
            ensemble.generate_batch(["fine", [{"role": "user", "content": "hi"}]])
        with pytest.raises(ConfigError, match="context window of 512 tokens"):
            ensemble.generate("word " * 600, max_new_tokens=10)
    finally:
        hook.remove()
    assert calls == []
    with pytest.raises(
        UnknownNameError, match="Known methods: contrastive, gac, safe, single, specfuse, sweetspan, unite"
    ):
        Ensemble([member], method="majority-vote")
    with pytest.raises(UnknownNameError, match="`member` is 'nope'"):
        Ensemble([member], method=Single(member="nope"))
    with pytest.raises(ConfigError, match="names must be unique"):
        Ensemble([member, member])
    with pytest.raises(ConfigError, match="at least one member"):
        Ensemble([])


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("cuda:7", "CUDA is not available|this machine has"),
        ("banana", "`device` must be a torch device"),
        ("meta", "not supported"),
    ],
)
def test_a_device_that_does_not_exist_fails_before_loading(device, message, monkeypatch) -> None:
    from ensemble_core import packaged

    def must_not_load(*_args, **_kwargs):
        raise AssertionError("nothing may be loaded before the device is checked")

    monkeypatch.setattr(packaged, "model_path", must_not_load)
    with pytest.raises(ConfigError, match=message):
        HFMember.from_pretrained("smollm2-135m-instruct", device=device)
    with pytest.raises(ConfigError, match="`dtype` must be one of"):
        HFMember.from_pretrained("smollm2-135m-instruct", dtype="int3")


def test_unknown_model_ids_are_a_load_error_with_a_hint() -> None:
    with pytest.raises(ModelLoadError, match="packaged name"):
        HFMember.from_pretrained("no-such-org/no-such-model")


def test_a_method_is_configuration_that_ensembles_share_without_rebinding(tiny_member) -> None:
    llama, qwen = tiny_member("tiny-llama"), tiny_member("tiny-qwen2")
    method = Single(member="tiny-qwen2")
    with pytest.raises(AttributeError):
        method.member = "tiny-llama"  # frozen
    both = Ensemble([llama, qwen], method=method)
    other = Ensemble([qwen], method=method)
    assert both.binding.reference == 1 and other.binding.reference == 0  # each ensemble binds for itself
    assert both.generate("The", max_new_tokens=3).token_ids.keys() == {"tiny-qwen2"}


def test_closing_returns_the_models_and_the_union(tiny_member, load_tokenizer) -> None:
    import gc
    import weakref

    from conftest import _tiny_config

    from ensemble_core.errors import ClosedError
    from ensemble_core.methods import GaC

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    model_class, config = _tiny_config("llama", len(tokenizer))
    config._attn_implementation = "sdpa"
    models = [model_class(config) for _ in range(2)]
    gone = [weakref.ref(m) for m in models]
    members = [HFMember(m, tokenizer, name=f"m{i}") for i, m in enumerate(models)]
    with Ensemble(members, method=GaC()) as ensemble:
        ensemble.generate("The", max_new_tokens=3)
        union = weakref.ref(ensemble.binding.cache["union"])
    assert ensemble.closed
    with pytest.raises(ClosedError, match="closed"):
        ensemble.generate("The", max_new_tokens=3)
    del models, members
    gc.collect()
    assert all(ref() is None for ref in gone)  # nothing holds the weights any more
    assert union() is None  # nor the union (not even the cache of recent unions)


def test_every_error_and_warning_the_library_raises_is_public() -> None:
    """Callers catch what the README documents by importing it from `ensemble_core`."""
    import inspect

    import ensemble_core
    from ensemble_core import errors

    raised = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, (errors.EnsembleError, Warning))
        and value.__module__ == errors.__name__
    }
    assert raised <= set(ensemble_core.__all__), sorted(raised - set(ensemble_core.__all__))
