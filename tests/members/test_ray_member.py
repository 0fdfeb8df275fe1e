"""Members hosted by Ray actors: the same text as local members, clear failure, nothing left behind.

They run on the test run's one local Ray cluster (`ray_cluster` in conftest.py; the two tiny members
ask for half a CPU each and stay up for the module); every actor runs one torch thread. The models
are the tiny random-weight ones (saved to a folder, so the actor loads exactly the weights the local
copy has) and one real packaged model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch
from conftest import packaged_member
from test_requests import METHODS
from test_wire import spelling_more

from ensemble_core import Ensemble, HFMember, RayMember
from ensemble_core.errors import ClosedError, ConfigError, ModelLoadError
from ensemble_core.members.contract import Continuations
from ensemble_core.members.own_choice import greedy_choice
from ensemble_core.members.ray_member import MemberFailedError, RaySession, WireTraffic

# Under pytest-xdist every test on the Ray cluster stays on the one worker that started it.
pytestmark = pytest.mark.xdist_group("ray")

PROMPTS = ["The river", "A much longer prompt about mountains, valleys and"]


@pytest.fixture(scope="module")
def tiny_folders(tiny_member, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny models as folders, as a user's checkpoints are."""
    folders = {}
    for name in ("tiny-llama", "tiny-qwen2"):
        folder = tmp_path_factory.mktemp(name)
        member = tiny_member(name)
        member.model.save_pretrained(folder)
        member.tokenizer.save_pretrained(folder)
        folders[name] = folder
    return folders


@pytest.fixture(scope="module")
def hosted(ray_cluster, tiny_folders) -> Iterator[list[RayMember]]:
    members = [
        RayMember.from_pretrained(str(tiny_folders[n]), name=n, dtype="float32", num_cpus=0.5) for n in tiny_folders
    ]
    yield members
    for member in members:
        member.close()


@pytest.fixture(scope="module")
def local(tiny_folders) -> list[HFMember]:
    return [HFMember.from_pretrained(str(tiny_folders[n]), name=n, dtype="float32", device="cpu") for n in tiny_folders]


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_writes_the_same_text_with_ray_hosted_members(method: str, hosted, local) -> None:
    over_ray = Ensemble(hosted, method=METHODS[method]).generate_batch(PROMPTS, max_new_tokens=16)
    in_process = Ensemble(local, method=METHODS[method]).generate_batch(PROMPTS, max_new_tokens=16)
    for remote, alone in zip(over_ray, in_process, strict=True):
        assert remote.text == alone.text
        assert remote.token_ids == alone.token_ids
        assert remote.finish_reason == alone.finish_reason
        assert remote.stats.method_stats == alone.stats.method_stats


def test_streamed_text_and_member_reports_match_local_members(hosted, local) -> None:
    streamed = "".join(c.text for c in Ensemble(hosted, method="gac").stream(PROMPTS[1], max_new_tokens=12))
    assert streamed == Ensemble(local, method="gac").generate(PROMPTS[1], max_new_tokens=12).text
    result = Ensemble(hosted, method="gac").generate(PROMPTS[0], max_new_tokens=8)
    alone = Ensemble(local, method="gac").generate(PROMPTS[0], max_new_tokens=8)
    assert list(result.stats.members) == list(alone.stats.members)
    for name, remote in result.stats.members.items():
        here = alone.stats.members[name]
        assert (remote.forwards, remote.forwarded_tokens, remote.own_tokens, remote.reencoded_tokens) == (
            here.forwards,
            here.forwarded_tokens,
            here.own_tokens,
            here.reencoded_tokens,
        )
    assert result.usage.prompt_tokens == alone.usage.prompt_tokens


def test_a_member_on_a_real_model_matches_the_local_one(ray_cluster) -> None:
    qwen = packaged_member("qwen2.5-coder-0.5b-instruct", "float32")
    smollm = packaged_member("smollm2-135m-instruct", "float32")
    hosted = RayMember.from_pretrained("smollm2-135m-instruct", dtype="float32", num_cpus=0.5)
    try:
        assert hosted.name == smollm.name and hosted.vocab.width == smollm.vocab.width
        assert hosted.render("Hi").ids == smollm.render("Hi").ids
        # The actor has its own torch thread budget: float32 sums in another order differ in the 7th digit.
        code = ["def add(a, b):"]
        [over_ray_score], [local_score] = hosted.text_logprob(code), smollm.text_logprob(code)
        assert over_ray_score.scored_bytes == local_score.scored_bytes
        assert over_ray_score.logprob == pytest.approx(local_score.logprob, rel=1e-5)
        question = [{"role": "user", "content": "Write a Python function that reverses a string."}]
        hosted.traffic = WireTraffic()
        over_ray = Ensemble([qwen, hosted], method="gac").generate(question, max_new_tokens=12)
        in_process = Ensemble([qwen, smollm], method="gac").generate(question, max_new_tokens=12)
        assert over_ray.text == in_process.text
        stats = over_ray.stats.method_stats
        assert hosted.traffic.kinds["about:dense"] == stats.ensembled_steps - stats.shortcut_steps
    finally:
        hosted.close()


def test_only_small_keys_stand_for_session_state_on_the_wire(hosted) -> None:
    member = hosted[0]
    member.traffic = WireTraffic()
    try:
        session = member.start({1: member.render("The river")}, Ensemble(hosted).boundary)
        assert isinstance(session, RaySession)
        (found,) = session.next([1])
        assert found.device.type == "cpu" and found.width == member.vocab.width
        assert type(found.origin).__name__ == "RemoteOrigin"  # the covering nodes stay in the actor
        session.commit(1, b" runs")  # rides along with the next call
        assert member.traffic.calls == 1
        assert member.vocab.table.spell(session.token_ids(1)) == b" runs"
        assert member.traffic.calls == 2
    finally:
        member.traffic = None


def test_a_distribution_crosses_as_a_summary_and_whole_only_when_asked(hosted) -> None:
    member = hosted[1]
    member.traffic = traffic = WireTraffic()
    try:
        session = member.start({1: member.render("A much longer prompt about")}, Ensemble(hosted).boundary)
        (found,) = session.next([1])
        assert traffic.kinds == {"next": 1}
        assert traffic.received < member.vocab.width  # far less than the 4 bytes per id of the whole
        values, ids = found.top(32)
        assert torch.equal(found.probs_at(ids), values)  # answered from the summary
        lookup = torch.arange(0, member.vocab.width, 7)  # most of these lie outside its top 256
        partly_fetched = found.probs_at(lookup)
        assert traffic.kinds == {"next": 1, "about:probs_at": 1}
        assert torch.equal(found.probs_at(lookup), partly_fetched)  # kept: no second question
        whole = found.dense
        assert traffic.kinds["about:dense"] == 1 and traffic.received > 4 * member.vocab.width
        assert torch.equal(partly_fetched, whole[lookup])
        exact = torch.topk(whole, 32)
        assert torch.equal(values, exact.values) and torch.equal(ids, exact.indices)
        assert found.total() == pytest.approx(float(whole.sum()), abs=1e-6)  # summed by the actor's one thread
        local = Continuations(whole, found.partial)
        assert found.greedy == greedy_choice(member.vocab, local)  # made in the actor by the same rule
        assert torch.equal(found.top(5)[1], torch.topk(whole, 5).indices)  # another k: asked once ...
        (after,) = session.next([1])
        top_calls = traffic.kinds["about:top"]
        after.top(5)
        assert top_calls == 1 and traffic.kinds["about:top"] == 1  # ... then sent with every distribution
    finally:
        member.traffic = None


def test_a_large_partial_group_crosses_in_part_and_every_method_writes_the_same_text(hosted, local) -> None:
    """After a prompt's trailing space every space-led token re-covers it (tens of thousands of
    candidates): the group crosses as its most likely candidates, and the text is the same."""
    prompts = ["The river ", "def f(x):\n    return x +"]
    member = hosted[1]
    member.traffic = traffic = WireTraffic()
    try:
        session = member.start({1: member.render(prompts[0])}, Ensemble(hosted).boundary)
        (found,) = session.next([1])
        (group,) = [g for g in found.partial if not g.complete]
        whole_bytes = 8 * len(spelling_more(member.vocab.table, b" "))
        assert traffic.kinds == {"next": 1} and traffic.received < whole_bytes / 20
        sent = len(group.known()[0])
        assert len(group.token_ids) > 20 * sent  # fetched whole only when read whole
        assert traffic.kinds["about:group"] == 1 and group.complete
    finally:
        member.traffic = None
    for method in ("gac", "unite", "safe"):
        over_ray = Ensemble(hosted, method=METHODS[method]).generate_batch(prompts, max_new_tokens=8)
        in_process = Ensemble(local, method=METHODS[method]).generate_batch(prompts, max_new_tokens=8)
        assert [r.text for r in over_ray] == [r.text for r in in_process]
        assert [r.token_ids for r in over_ray] == [r.token_ids for r in in_process]


def test_greedy_gac_moves_a_whole_distribution_only_where_the_shortcut_cannot_decide(hosted, local) -> None:
    for member in hosted:
        member.traffic = WireTraffic()
    try:
        result = Ensemble(hosted, method="gac").generate(PROMPTS[1], max_new_tokens=12)
        assert result.text == Ensemble(local, method="gac").generate(PROMPTS[1], max_new_tokens=12).text
        stats = result.stats.method_stats
        undecided = stats.ensembled_steps - stats.shortcut_steps
        for member in hosted:
            assert member.traffic.kinds["about:dense"] == undecided
            if not undecided:
                assert member.traffic.received / member.traffic.kinds["next"] < member.vocab.width
    finally:
        for member in hosted:
            member.traffic = None


def test_a_dead_actor_fails_the_generation_naming_the_member_and_restart_recovers(hosted, local) -> None:
    ensemble = Ensemble(hosted, method="gac")
    victim = hosted[1]
    with pytest.raises(MemberFailedError, match=f"(?s)'{victim.name}'.*died.*restart"):
        for number, _ in enumerate(ensemble.stream(PROMPTS[1], max_new_tokens=12)):
            if number == 2:
                ray.kill(victim.actor, no_restart=True)
    assert not victim.alive()
    victim.restart()
    assert victim.alive()
    again = ensemble.generate(PROMPTS[1], max_new_tokens=12).text
    assert again == Ensemble(local, method="gac").generate(PROMPTS[1], max_new_tokens=12).text


def test_closing_the_ensemble_leaves_no_actor_behind(ray_cluster, tiny_folders) -> None:
    ours = _our_actors
    before = ours()
    members = [RayMember.from_pretrained(str(tiny_folders["tiny-llama"]), name=n, num_cpus=0.5) for n in ("x", "y")]
    assert len(ours() - before) == 2
    ensemble = Ensemble(members, method="gac")
    ensemble.generate("Hello", max_new_tokens=2)
    ensemble.close()
    assert ours() == before
    with pytest.raises(ClosedError, match="'x' was closed"):
        members[0].start({}, ensemble.boundary)


def test_bad_input_fails_before_an_actor_starts_and_a_bad_model_names_itself(hosted, tmp_path) -> None:
    with pytest.raises(ConfigError, match="num_gpus"):
        RayMember.from_pretrained("smollm2-135m-instruct", num_gpus=-1)
    with pytest.raises(ConfigError, match="ray_options"):
        RayMember.from_pretrained("smollm2-135m-instruct", ray_options={"num_cpus": 2})
    with pytest.raises(ConfigError, match=r"has .*'CPU': 4.* asks for .*'CPU': 5"):
        RayMember.from_pretrained("smollm2-135m-instruct", num_cpus=5)
    with pytest.raises(ConfigError, match="dtype"):
        RayMember.from_pretrained("smollm2-135m-instruct", dtype="float7")
    with pytest.raises(ModelLoadError, match="no-such-model"):
        RayMember.from_pretrained(str(tmp_path / "no-such-model"), num_cpus=0.5)
    # the two tiny members hold one CPU of four: one asking for four waits, until its timeout
    with pytest.raises(ModelLoadError, match="did not start within 2 s"):
        RayMember.from_pretrained("smollm2-135m-instruct", num_cpus=4, start_timeout=2)


def test_adapters_put_their_members_on_ray_with_one_argument(ray_cluster, tiny_folders, local) -> None:
    from llama_index.core.llms import ChatMessage

    from ensemble_core.loading import loaded_specs, release_shared
    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM

    before = _our_actors()
    models = [str(folder) for folder in tiny_folders.values()]
    chat = ChatEnsemble(models=models, placement="ray", dtype="float32", max_tokens=8)
    llm = EnsembleLLM(models=models, placement="ray", dtype="float32", max_new_tokens=8)
    question = [{"role": "user", "content": "The river"}]
    try:
        reply = chat.invoke("The river").content
        assert reply == Ensemble(local, method="gac").generate(question, max_new_tokens=8).text
        assert len(_our_actors() - before) == 2  # one actor per member
        assert llm.chat([ChatMessage(role="user", content="The river")]).message.content == reply
        assert len(_our_actors() - before) == 2  # the same spec shares the loaded members
    finally:
        for spec in loaded_specs():
            release_shared(spec)
    assert _our_actors() == before
    with pytest.raises(ValueError, match=r"placement.*'ray://host:port'"):
        ChatEnsemble(models=models, placement="cluster")


def _our_actors() -> set[str]:
    named = ray.util.list_named_actors(all_namespaces=True)
    return {a["name"] for a in named if a["name"].startswith("ensemble-llm")}
