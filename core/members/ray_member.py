"""`RayMember`: a member whose model, KV cache and sessions live in a Ray actor.

A member too big for the driver's device, or one that should sit on another node of a cluster,
runs in an actor (`num_gpus`, `num_cpus`, any Ray scheduling option). The actor hosts an
ordinary `HFMember`; the driver keeps only what is static and cheap (the tokenizer, for
rendering prompts and for the methods' token tables) and a proxy session that forwards the
member contract (`members.contract.MemberSession`) call by call. So every method works
unchanged, and the greedy text is the same as with the member in the driver.

What crosses the wire per call: the arguments (request ids, committed bytes, drafts,
candidates) and the results with their tensors moved to the CPU: `next`/`read` return a
`WireSummary` per distribution (its top entries, total and greedy choice, and its large
partial groups' most likely candidates, see `members.wire`), never the logits-width
distribution or a whole large group unless a method needs the full union; `score` returns the
per-token values. Session-private state never crosses: a distribution arrives with a small key
in place of its origin; `write`, and questions about probabilities the summary lacks, send the
key back. Calls that return nothing (`commit`, `drop`, `admit`) wait on the driver and ride
along with the next call that does, so a greedy GaC step costs the member one round trip for
`next`, one per `write`, and one where the other members' candidates lie outside its top 256
(or outside a large partial group's candidates sent).

A dead actor (node lost, out of memory, `ray.kill`) makes the running generation fail with
`MemberFailedError` naming the member; `RayMember.restart()` loads it again in a new actor.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import uuid
import weakref
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ensemble_core.errors import (
    ClosedError,
    ConfigError,
    EnsembleError,
    GenerationError,
    MemberFailedError,
    ModelLoadError,
)
from ensemble_core.extras import require_extra
from ensemble_core.members.base import TokenizerMember
from ensemble_core.members.contract import (
    Boundary,
    Candidate,
    CandidateScore,
    Continuations,
    DraftReading,
    MemberSession,
    MemberVocab,
    Pick,
    RenderedPrompt,
    RequestId,
    ScoreKind,
    SessionStats,
)
from ensemble_core.members.lanes import check_num_threads
from ensemble_core.members.own_choice import greedy_choice
from ensemble_core.members.token_tree import Backend
from ensemble_core.members.wire import (
    SUMMARY_TOP_KS,
    PartialSummary,
    SummarizedContinuations,
    WireSummary,
    summarize,
    wire_group,
    wire_group_probs,
    wire_top,
)


@dataclass(frozen=True)
class RemoteOrigin:
    """Stands in for a `Continuations`' origin on the driver: the actor keeps the real one."""

    key: int


# ---------------------------------------------------------------------------- the actor side


def _on_cpu(value: torch.Tensor) -> torch.Tensor:
    return value.detach().to("cpu")


class MemberHost:
    """What runs inside the Ray actor: one `HFMember` and the sessions opened on it.

    Distributions handed out are kept (per request) until they are two commits AND two calls
    that hand out distributions old, so a method can still `write` a pick from the step before
    and ask about a draft's readings after committing part of it; older ones are forgotten.
    They leave as `WireSummary`s (see `members.wire`); the driver asks `about` the rest.
    """

    def __init__(self, name_or_path: str, load_options: Mapping[str, Any], num_threads: int | None):
        from ensemble_core.members.hf import HFMember

        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.member = HFMember.from_pretrained(name_or_path, **dict(load_options))
        self._sessions: dict[int, MemberSession] = {}
        # (session, request) -> key -> (commits, rounds when issued, the distribution)
        self._issued: dict[tuple[int, RequestId], dict[int, tuple[int, int, Continuations]]] = {}
        self._ages: dict[tuple[int, RequestId], list[int]] = {}  # -> [commits, rounds] so far
        self._keys = itertools.count(1)

    def facts(self) -> dict[str, Any]:
        member = self.member
        return {
            "tokenizer": member.tokenizer,
            "eos_ids": sorted(member.eos_token_ids),
            "width": member.logits_width,
            "context_window": member.context_window,
            "device": str(member.device),
            "pid": os.getpid(),
        }

    def open(self, session: int, prompts: Mapping[RequestId, RenderedPrompt], boundary: Boundary) -> None:
        self._sessions[session] = self.member.start(prompts, boundary)

    def close(self, session: int) -> None:
        self._sessions.pop(session, None)
        for key in [k for k in self._issued if k[0] == session]:
            del self._issued[key]
            self._ages.pop(key, None)

    def next_token_logprobs(self, ids: list[int]) -> torch.Tensor:
        return self.member._next_token_logprobs(ids)

    def call(self, session: int, pending: list[tuple[str, tuple]], name: str, args: tuple) -> Any:
        """Apply the calls that waited on the driver, then answer `name(*args)`."""
        opened = self._sessions.get(session)
        if opened is None:
            raise GenerationError(
                f"Member {self.member.name!r} has no session {session} (its actor was restarted); "
                "start a new generation."
            )
        for waiting, waiting_args in pending:
            self._apply(session, opened, waiting, waiting_args)
        return self._apply(session, opened, name, args)

    def _apply(self, session: int, opened: MemberSession, name: str, args: tuple) -> Any:
        if name == "next":
            requests, temperature, top_ks = args
            found = opened.next(requests, temperature)
            self._new_round(session, requests)
            return [
                None if c is None else self._issue(session, r, c, top_ks) for r, c in zip(requests, found, strict=True)
            ]
        if name == "read":
            requests, drafts, temperature, written, top_ks = args
            readings = opened.read(requests, drafts, temperature, written)
            self._new_round(session, requests)
            return [  # per request: (a summary per boundary, how many pieces it read as written)
                ([None if c is None else self._issue(session, r, c, top_ks) for c in reading.at], reading.written)
                for r, reading in zip(requests, readings, strict=True)
            ]
        if name == "about":
            request, key, what, argument = args
            return self._about(self._issued_to(session, request, key), what, argument, self.member.vocab)
        if name == "write":
            request, key, pick = args
            return opened.write(request, self._issued_to(session, request, key), pick)
        if name == "score":
            found = opened.score(*args)
            return [[CandidateScore(_on_cpu(s.values), s.tokens) for s in row] for row in found]
        if name == "commit":
            request, data = args
            opened.commit(request, data)
            self._age(session, request, 0)
            return None
        if name == "drop":
            (requests,) = args
            opened.drop(requests)
            for request in requests:
                self._issued.pop((session, request), None)
                self._ages.pop((session, request), None)
            return None
        if name in ("admit", "lagging", "token_ids", "prompt_tokens", "stats"):
            return getattr(opened, name)(*args)
        raise GenerationError(f"unknown member call {name!r}")

    def _issue(self, session: int, request: RequestId, found: Continuations, top_ks: Sequence[int]) -> WireSummary:
        key = next(self._keys)
        slot = (session, request)
        commits, rounds = self._ages.setdefault(slot, [0, 0])
        self._issued.setdefault(slot, {})[key] = (commits, rounds, found)
        return summarize(found, key, top_ks, greedy_choice(self.member.vocab, found))

    @staticmethod
    def _about(found: Continuations, what: str, argument: Any, vocab: MemberVocab) -> Any:
        if what == "dense":
            return _on_cpu(found.dense.float())
        if what == "probs_at":
            return _on_cpu(found.probs_at(argument.to(found.device)).float())
        if what == "top":
            return wire_top(found, argument)
        if what == "group":
            return wire_group(found.partial[argument])
        if what == "group_probs":
            group, token_ids = argument
            return wire_group_probs(found.partial[group], token_ids)
        if what == "mass_extending":
            return found.mass_extending(argument, vocab)
        raise GenerationError(f"unknown question about a distribution: {what!r}")

    def _issued_to(self, session: int, request: RequestId, key: int) -> Continuations:
        kept = self._issued.get((session, request), {}).get(key)
        if kept is None:
            raise GenerationError(
                f"Member {self.member.name!r} was asked about distributions it no longer keeps "
                f"(request {request}, key {key}); write picks from the latest `next` or `read`."
            )
        return kept[2]

    def _new_round(self, session: int, requests: Sequence[RequestId]) -> None:
        for request in requests:
            self._age(session, request, 1)

    def _age(self, session: int, request: RequestId, which: int) -> None:
        """One more commit (0) or round (1) for the request; forget what is old by both counts."""
        slot = (session, request)
        ages = self._ages.setdefault(slot, [0, 0])
        ages[which] += 1
        issued = self._issued.get(slot, {})
        for key in [k for k, (c, r, _) in issued.items() if c < ages[0] - 1 and r < ages[1] - 1]:
            del issued[key]


# ---------------------------------------------------------------------------- the driver side


class RayMember(TokenizerMember):
    """A Hugging Face causal LM served by a Ray actor, ready to take part in an ensemble.

    Build it with `RayMember.from_pretrained(...)`. Ray is started on first use (`ray.init`,
    which joins the cluster at `$RAY_ADDRESS` when set) unless it is already running.
    """

    remote = True  # every call waits on the actor: its own lane, so members overlap

    def __init__(
        self,
        name_or_path: str,
        load_options: Mapping[str, Any],
        actor_options: Mapping[str, Any],
        *,
        name: str,
        num_threads: int | None = None,
        start_timeout: float = 600.0,
    ):
        self._source = name_or_path
        self._load_options = dict(load_options)
        self._actor_options = dict(actor_options)
        self._host_threads = num_threads
        self._start_timeout = start_timeout
        self._sessions = itertools.count(1)
        self.traffic: WireTraffic | None = None
        """Set to a `WireTraffic()` to count the bytes of every call's arguments and results."""
        self.actor = self._spawn(name)
        facts = self._loaded(name)
        super().__init__(facts["tokenizer"], name, frozenset(facts["eos_ids"]), facts["width"], torch.device("cpu"))
        self.context_window = int(facts["context_window"])
        self.host_device = facts["device"]
        """Where the model sits in its actor (distributions reach the driver on the CPU)."""

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = "auto",
        name: str | None = None,
        chat_template: str | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
        num_threads: int | None = None,
        num_cpus: float = 1,
        num_gpus: float = 0,
        ray_options: Mapping[str, Any] | None = None,
        address: str | None = None,
        start_timeout: float = 600.0,
    ) -> RayMember:
        """Load a member in a new Ray actor: the arguments of `HFMember.from_pretrained`, plus
        where the actor runs.

        Args:
            device: the model's device inside the actor (default: its GPU when `num_gpus` > 0,
                else the CPU).
            num_threads: torch's intra-op threads in the actor (default: `num_cpus`, rounded up).
            num_cpus / num_gpus: the actor's Ray resources.
            ray_options: any other `ActorClass.options(...)` argument: `resources`,
                `scheduling_strategy` (a node, a placement group), `runtime_env`, ...
            address: the cluster to join when Ray is not running yet (default: `$RAY_ADDRESS`,
                else a local Ray started for this process).
            start_timeout: seconds to wait for the actor to be placed and load the model (an
                actor whose resources are all taken waits for them; this ends the wait).

        Raises:
            MissingPackageError: Ray is not installed (`pip install 'ensemble-llm[ray]'`).
            ConfigError: bad resources or options (checked before an actor starts).
            ModelLoadError: the actor could not load the model.
        """
        require_extra("ray", "ray")
        from ensemble_core.members.hf import checked_member_name

        member_name = checked_member_name(name_or_path, name)
        check_num_threads(num_threads)
        for label, amount in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
            if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
                raise ConfigError(f"`{label}` has to be a number >= 0, but is {amount!r}.")
        options = dict(ray_options or {})
        clash = {"num_cpus", "num_gpus"} & set(options)
        if clash:
            raise ConfigError(f"give {sorted(clash)} as arguments of their own, not inside `ray_options`.")
        if isinstance(start_timeout, bool) or not isinstance(start_timeout, int | float) or start_timeout <= 0:
            raise ConfigError(f"`start_timeout` has to be a number of seconds > 0, but is {start_timeout!r}.")
        if device is None:
            device = "cuda" if num_gpus > 0 else "cpu"
        from ensemble_core.devices import resolve_dtype

        resolve_dtype(dtype)  # a bad dtype fails here, not in the actor
        load = {
            "device": str(device),
            "dtype": dtype,
            "chat_template": chat_template,
            "model_kwargs": dict(model_kwargs or {}),
        }
        threads = num_threads if num_threads is not None else max(1, int(-(-num_cpus // 1)))
        _ensure_ray(address)
        _check_cluster_has({"CPU": num_cpus, "GPU": num_gpus})
        actor = {"num_cpus": num_cpus, "num_gpus": num_gpus, **options}
        return cls(name_or_path, load, actor, name=member_name, num_threads=threads, start_timeout=start_timeout)

    # ------------------------------------------------------------------ the actor's life

    def _spawn(self, name: str) -> Any:
        import ray

        options = {"name": f"ensemble-llm:{name}:{uuid.uuid4().hex[:8]}", **self._actor_options}
        host = ray.remote(MemberHost).options(max_restarts=0, max_task_retries=0, **options)
        return host.remote(self._source, self._load_options, self._host_threads)

    def _ask(self, reference: Any, name: str | None = None, timeout: float | None = None) -> Any:
        """The result of a call on the actor; a dead actor becomes `MemberFailedError`."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        try:
            return ray.get(reference, timeout=timeout)
        except RayTaskError as error:  # the call raised in the actor: its own error, said on this side
            cause = error.cause if isinstance(error.cause, BaseException) else error
            if isinstance(cause, EnsembleError):
                raise cause from None
            raise MemberFailedError.of(name or self.name, cause) from error
        except GetTimeoutError:
            self._kill()
            raise ModelLoadError(
                f"Member {name or self.name!r}: its Ray actor did not start within {timeout:g} s "
                f"(asked {self._actor_options}; free now: {_free_resources()}). Free resources, "
                "ask for fewer, or raise `start_timeout`."
            ) from None
        except RayActorError as error:
            who = name or self.name
            raise MemberFailedError(
                f"Member {who!r} (a Ray actor) died or could not start: {error}\n"
                "Its running requests are lost. Call `member.restart()` to load it again in a new actor.",
                who,
            ) from error

    def _loaded(self, name: str) -> dict[str, Any]:
        """The new actor's static facts, once it has loaded the model."""
        try:
            return self._ask(self.actor.facts.remote(), name, timeout=self._start_timeout)
        except MemberFailedError as error:
            self._kill()
            raise ModelLoadError(
                f"Member {name!r} could not be loaded in its Ray actor from {self._source!r}: {error.__cause__}"
            ) from error

    def restart(self) -> None:
        """Load the member again in a new actor (after its actor died); sessions of the old one are gone."""
        if self._closed:
            raise ClosedError(f"Member {self.name!r} was closed; load it again to use it.")
        self._kill()
        self.actor = self._spawn(self.name)
        self._loaded(self.name)

    def alive(self) -> bool:
        """Whether the actor answers (a cheap round trip)."""
        try:
            self._ask(self.actor.facts.remote())
        except MemberFailedError:
            return False
        return True

    def close(self) -> None:
        """End the actor (its model and caches go with it)."""
        super().close()
        self._kill()

    def _kill(self) -> None:
        import ray

        if getattr(self, "actor", None) is not None and ray.is_initialized():
            ray.kill(self.actor, no_restart=True)

    # ------------------------------------------------------------------ the member interface

    def start(self, prompts: Mapping[RequestId, RenderedPrompt], boundary: Boundary) -> MemberSession:
        if self._closed:
            raise ClosedError(f"Member {self.name!r} was closed; load it again to use it.")
        number = next(self._sessions)
        actor = self.actor
        self._ask(actor.open.remote(number, dict(prompts), boundary))
        session = RaySession(self, actor, number)
        weakref.finalize(session, _close_quietly, actor, number)
        return session

    def _backend(self) -> Backend:
        raise GenerationError(f"Member {self.name!r} evaluates in its Ray actor; it has no local backend.")

    def _next_token_logprobs(self, ids: list[int]) -> torch.Tensor:
        return self._ask(self.actor.next_token_logprobs.remote(ids))


def _close_quietly(actor: Any, session: int) -> None:
    import ray

    if not ray.is_initialized():  # a call now would start a new Ray
        return
    with contextlib.suppress(Exception):  # the actor may be gone already: nothing to free then
        actor.close.remote(session)


@dataclass
class WireTraffic:
    """Bytes that crossed between the driver and a member's actor (pickled arguments + results)."""

    calls: int = 0
    sent: int = 0
    received: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    """Calls by kind: "next", "write", ..., and "about:dense" / "about:probs_at" / "about:top" /
    "about:group" / "about:group_probs" / "about:mass_extending" for questions about a
    distribution's summary (a whole distribution fetched is "about:dense", a whole partial group
    "about:group")."""
    withheld: int = 0
    """Partial candidates that stayed in the actor: in large groups, beyond those sent."""

    def count(self, kind: str, arguments: Any, result: Any) -> None:
        self.calls += 1
        self.kinds[kind] += 1
        self.sent += len(pickle.dumps(arguments, protocol=5))
        self.received += len(pickle.dumps(result, protocol=5))
        if kind in ("next", "read"):
            self.withheld += sum(g.count - len(g.token_ids) for g in _partial_summaries(result))


def _partial_summaries(result: Any) -> Iterator[PartialSummary]:
    """The large groups' summaries in a `next` or `read` result (lists of summaries, or of
    (summaries, pieces read as written) pairs)."""
    if isinstance(result, WireSummary):
        yield from (g for g in result.partial if isinstance(g, PartialSummary))
    elif isinstance(result, list | tuple):
        for item in result:
            yield from _partial_summaries(item)


class RaySession:
    """The driver's side of a session that lives in a member's actor (`MemberSession`)."""

    def __init__(self, member: RayMember, actor: Any, number: int):
        self._member = member
        self._actor = actor
        self._number = number
        self._pending: list[tuple[str, tuple]] = []
        self._top_ks = set(SUMMARY_TOP_KS)  # what the methods ask `top` for: sent with every distribution

    def _call(self, name: str, *args: Any) -> Any:
        pending, self._pending = self._pending, []
        result = self._member._ask(self._actor.call.remote(self._number, pending, name, args))
        if self._member.traffic is not None:
            kind = f"about:{args[2]}" if name == "about" else name
            self._member.traffic.count(kind, (pending, name, args), result)
        return result

    def _later(self, name: str, *args: Any) -> None:
        self._pending.append((name, args))

    def next(self, requests: Sequence[RequestId], temperature: float = 1.0) -> list[Continuations | None]:
        found = self._call("next", list(requests), temperature, sorted(self._top_ks))
        return [self._received(r, s) for r, s in zip(requests, found, strict=True)]

    def _received(self, request: RequestId, summary: WireSummary | None) -> Continuations | None:
        if summary is None:
            return None

        def fetch(what: str, argument: Any) -> Any:
            return self._call("about", request, summary.key, what, argument)

        return SummarizedContinuations(summary, RemoteOrigin(summary.key), fetch, self._top_ks.add)

    def write(self, request: RequestId, continuations: Continuations, pick: Pick) -> bool:
        origin = continuations.origin
        if not isinstance(origin, RemoteOrigin):
            raise GenerationError(
                f"Member {self._member.name!r} can only write picks from its own `next` or `read` results."
            )
        return self._call("write", request, origin.key, pick)

    def read(
        self,
        requests: Sequence[RequestId],
        drafts: Sequence[Sequence[bytes]],
        temperature: float = 1.0,
        written: Sequence[int] | None = None,
    ) -> list[DraftReading]:
        chosen = None if written is None else list(written)
        found = self._call("read", list(requests), [list(d) for d in drafts], temperature, chosen, sorted(self._top_ks))
        return [
            DraftReading([self._received(r, s) for s in summaries], written)
            for r, (summaries, written) in zip(requests, found, strict=True)
        ]

    def score(
        self,
        requests: Sequence[RequestId],
        candidates: Sequence[Sequence[Candidate]],
        kind: ScoreKind = ScoreKind.LOGPROB,
    ) -> list[list[CandidateScore]]:
        return self._call("score", list(requests), [list(c) for c in candidates], kind)

    def commit(self, request: RequestId, data: bytes) -> None:
        self._later("commit", request, bytes(data))

    def drop(self, requests: Sequence[RequestId]) -> None:
        self._later("drop", list(requests))

    def admit(self, prompts: Mapping[RequestId, RenderedPrompt]) -> None:
        self._later("admit", dict(prompts))

    def lagging(self, request: RequestId) -> bool:
        return self._call("lagging", request)

    def token_ids(self, request: RequestId) -> list[int]:
        return self._call("token_ids", request)

    def prompt_tokens(self, request: RequestId) -> int:
        return self._call("prompt_tokens", request)

    def stats(self) -> SessionStats:
        return self._call("stats")


def _free_resources() -> dict[str, float]:
    import ray

    return {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}


def _check_cluster_has(wanted: Mapping[str, float]) -> None:
    """An actor asking for more than the whole cluster has would wait forever: say so now."""
    import ray

    total = ray.cluster_resources()
    short = {k: v for k, v in wanted.items() if v and v > total.get(k, 0)}
    if short:
        raise ConfigError(
            f"The Ray cluster has { ({k: total.get(k, 0) for k in short}) } in all, but the member asks for {short}; "
            "ask for less, or add nodes to the cluster."
        )


def _ensure_ray(address: str | None) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS"))


__all__ = ["MemberFailedError", "RayMember", "RaySession", "WireTraffic"]
