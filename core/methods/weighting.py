"""Member weights that need no hand tuning (`weights="auto"`), for GaC, UniTE and SAFE.

Two rules, both per request:

* `"prompt"` (PackLLM-sim, Mavromatis et al. 2024): before generating, every member scores the
  prompt's text (`Member.text_logprob`, per byte, so tokenizers compare); weights are
  softmax(log-likelihood per byte / tau). A member that predicts the prompt well knows its
  domain, and the prompt is text none of the members wrote, so it is fair evidence.
* `"agreement"` (Hedge, as SpecEM weights segments): weights start equal and, after every
  ensembled step, each member gains in proportion to the probability it gave the committed
  text: w_i <- w_i * exp(eta_t * p_i(committed)), eta_t = sqrt(8 ln K / t) (Hedge's standard
  rate for K experts and rewards in [0, 1]), then normalised.

`"auto"` is the rule the published evaluation kept: on HumanEval 0-39 over the packaged trio,
the prompt rule gave GaC 62.5% and the agreement rule 52.5%, against 22.5% with equal weights
and 65% for Qwen alone (docs/results/boundary/report.md).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ensemble_core.members.contract import MemberVocab

PROMPT_TEMPERATURE = 0.1  # nats per byte: a member 0.1 nats/byte better gets e times the weight
PROMPT_BYTES = 1024  # the prompt's last bytes each member scores (a cost bound)


class WeightRule(enum.Enum):
    """How member weights are found when they are not given as numbers."""

    PROMPT = "prompt"
    AGREEMENT = "agreement"


AUTO_RULE = WeightRule.PROMPT
RULE_NAMES = ("auto", *(rule.value for rule in WeightRule))


def rule_of(value: str) -> WeightRule:
    """The rule a weights string names ("auto" is `AUTO_RULE`)."""
    return AUTO_RULE if value == "auto" else WeightRule(value)


def prompt_weights(per_byte: Sequence[float | None], temperature: float = PROMPT_TEMPERATURE) -> tuple[float, ...]:
    """softmax(log-likelihood per byte / temperature); members with no score get the mean's weight
    (an empty prompt says nothing: equal weights)."""
    known = [v for v in per_byte if v is not None]
    if not known:
        return tuple([1.0 / len(per_byte)] * len(per_byte))
    mean = sum(known) / len(known)
    filled = [mean if v is None else v for v in per_byte]
    top = max(filled)
    raw = [math.exp((v - top) / temperature) for v in filled]
    total = sum(raw)
    return tuple(r / total for r in raw)


class Agreement:
    """Hedge weights for one request (see the module docstring)."""

    def __init__(self, weights: Sequence[float]):
        self.active = [i for i, w in enumerate(weights) if w > 0]
        self.log_weights = [0.0 if w > 0 else -math.inf for w in weights]
        self.rounds = 0

    @property
    def weights(self) -> tuple[float, ...]:
        top = max(self.log_weights)
        raw = [math.exp(v - top) if v > -math.inf else 0.0 for v in self.log_weights]
        total = sum(raw)
        return tuple(r / total for r in raw)

    def observe(self, rewards: dict[int, float]) -> None:
        """Rewards in [0, 1] per member (its probability of the committed text)."""
        self.rounds += 1
        rate = math.sqrt(8 * math.log(max(2, len(self.active))) / self.rounds)
        for member, reward in rewards.items():
            if self.log_weights[member] > -math.inf:
                self.log_weights[member] += rate * min(1.0, max(0.0, reward))


class RequestWeights:
    """A run's member weights per request: the binding's, the prompt rule's (found before the run
    started and handed in), or the agreement rule's (learned as the run commits)."""

    def __init__(self, weights: Sequence[float], rule: WeightRule | None):
        self._start = tuple(weights)
        self._rule = rule
        self._learned: dict[int, Agreement] = {}

    def of(self, request: int, prior: Sequence[float] | None = None) -> Sequence[float] | None:
        """The request's weights now (None: the binding's own)."""
        if self._rule is WeightRule.AGREEMENT:
            return self._agreement(request).weights
        return prior

    def observe(self, request: int, rewards: Callable[[], dict[int, float]]) -> None:
        """Members' probabilities of what was just committed, asked for only by a learning rule
        (finding them reads the device)."""
        if self._rule is WeightRule.AGREEMENT:
            self._agreement(request).observe(rewards())

    def drop(self, requests: Sequence[int]) -> None:
        for request in requests:
            self._learned.pop(request, None)

    def _agreement(self, request: int) -> Agreement:
        if request not in self._learned:
            self._learned[request] = Agreement(self._start)
        return self._learned[request]


def named_weights(members: Sequence[MemberVocab], weights: Sequence[float]) -> dict[str, float]:
    """Weights by member name, rounded for reports ."""
    return {m.name: round(w, 4) for m, w in zip(members, weights, strict=True) if w > 0}
