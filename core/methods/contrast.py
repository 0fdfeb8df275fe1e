"""Contrastive decoding: a strong member (the expert) corrected by a weaker one of its family.

Averaging (GaC) lets a much weaker member pull the ensemble toward its own mistakes: with
Qwen2.5-Coder-1.5B and -0.5B, every averaging rule tried stays at or below the 1.5B alone
(README, pair (c)). Contrastive decoding (Li et al. 2023, "Contrastive Decoding: Open-ended
Text Generation as Optimization"; O'Brien & Lewis 2023, "Contrastive Decoding Improves
Reasoning in Large Language Models") uses the weaker member the other way round: what the
amateur also finds likely is what both get from surface patterns; what the expert prefers
MORE than the amateur is what the expert's extra capacity knows. At each step, over the
expert's plausible candidates (probability at least `alpha` times its best),

    score(c) = log p_e(c) + beta * (log p_e(c) - log p_a(c))

which is O'Brien & Lewis's (1 + beta) log p_e - beta log p_a written so that one model twice
scores exactly log p_e (the contrast is exactly 0): greedy, one model twice and beta = 0 are
the expert alone. Sampling draws from the softmax of the scores over the plausible candidates
only, so it never equals the expert's own sampling (the cut removes its long tail), and the
cut is taken on the tempered distributions (a lower temperature leaves fewer candidates).
Their defaults, beta = 0.5 and alpha = 0.1, are ours: nothing was tuned on our evaluation.
Options scored by probability (multiple choice, tool picking) follow the same rule over the
options (`combine_options`).

Candidates are texts, as for every token-level method (boundary-corrected distributions over
the union vocabulary), so the members need not share a tokenizer; but the rule is meant for
members of one family, whose probabilities of one text compare. A plausible text the amateur
cannot write in one step (probability 0: its tokens split it differently) gets no contrast
term, rather than an unbounded bonus for a vocabulary accident; a text it has as a rare token
still gets the large bonus its small probability gives, which across families can be one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ensemble_core.errors import ConfigError, GenerationError
from ensemble_core.members.contract import MemberVocab, RequestId
from ensemble_core.methods.base import Binding, DecodeState, bind_all, check_fraction, register, role_index
from ensemble_core.methods.combine import Scored, Step
from ensemble_core.methods.token import TokenMethod, TokenStats

_PEEK = 64  # candidates looked at before the whole plausibility mask is read


@register("contrastive")
@dataclass(frozen=True)
class Contrastive(TokenMethod):
    """Contrastive decoding over two members: the expert's choice, corrected by what the amateur
    also finds likely (see the module docstring for the rule and its source).

    Args:
        expert: the stronger member (name or unique prefix); default the first. The other member
            is the amateur.
        beta: how strongly the amateur's preferences are subtracted; 0 is the expert alone.
            O'Brien & Lewis's 0.5 by default.
        alpha: the plausibility cut: only candidates with at least `alpha` times the expert's
            best probability can be chosen, so the contrast never promotes text the expert
            finds unlikely. In (0, 1]; 0.1 by default.

    Example:
        >>> Ensemble([coder_1_5b, coder_0_5b], method=Contrastive(expert="qwen2.5-coder-1.5b"))  # doctest: +SKIP
    """

    expert: str | None = None
    beta: float = 0.5
    alpha: float = 0.1

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "beta", check_fraction(self.beta, "beta", 0.0, math.inf, low_open=False, high_open=True)
        )
        object.__setattr__(self, "alpha", check_fraction(self.alpha, "alpha", 0.0, 1.0, low_open=True, high_open=False))

    def reference(self, members: Sequence[MemberVocab]) -> int:
        return role_index(members, self.expert, "expert")

    def check_member_count(self, count: int) -> None:
        if count != 2:
            raise ConfigError(
                f"`contrastive` takes two members, an expert and an amateur, but the ensemble has {count}; "
                "use GaC or UniTE to combine more."
            )

    def bind(self, members: Sequence[MemberVocab]) -> Binding:
        self.check_member_count(len(members))
        expert = self.reference(members)
        weights = [1.0 if i == expert else 0.0 for i in range(2)]  # ties go to the expert's own choice
        return bind_all(self, members, weights, reference=expert, roles={"expert": expert, "amateur": 1 - expert})

    def decide(self, step: Step, state: DecodeState, request: RequestId, stats: TokenStats) -> int:
        expert = role_index(state.members, self.expert, "expert")
        if expert not in step.raw:  # every commit is a text the expert finds plausible, so it can write it
            raise GenerationError(f"The expert {state.members[expert].name!r} cannot continue request {request}.")
        amateur = 1 - expert
        scored = self.contrast(step, expert, amateur if amateur in step.raw else None)
        generator = state.generators.get(request)
        if state.settings.greedy or generator is None:
            return step.pick(scored)
        softmaxed = Scored(scored.entries, torch.softmax(scored.probs, dim=0), scored.listed)
        return step.choose(softmaxed, state.settings, generator)

    def contrast(self, step: Step, expert: int, amateur: int | None) -> Scored:
        """The expert's plausible entries (in text order) with their contrastive scores; without
        the amateur (it has no tokens for the committed text) the contrast is 0. Both members'
        probabilities of the plausible entries come from one function (`Step.mass`), so one
        model twice has a contrast of exactly 0; only the cut needs the expert's whole
        distribution."""
        whole = step.full([1.0 if m == expert else 0.0 for m in range(len(step.weights))])
        listed = step.in_text_order(self._plausible_entries(step, whole))
        theirs = None if amateur is None else step.mass(amateur, listed)
        return Scored(step.device_entries(listed), self._scores(step.mass(expert, listed), theirs), listed)

    def combine_options(
        self, binding: Binding, shares: Mapping[int, torch.Tensor], weights: Sequence[float]
    ) -> torch.Tensor:
        """Options scored as tokens are chosen: the contrastive scores of the expert's plausible
        options (its probability at least `alpha` times its best option's), softmaxed."""
        own, theirs = shares[binding.roles["expert"]], shares.get(binding.roles["amateur"])
        scores = torch.where(self._plausible(own), self._scores(own, theirs), -math.inf)
        return torch.softmax(scores, dim=0).to(torch.float32)

    def _plausible_entries(self, step: Step, probs: torch.Tensor) -> np.ndarray:
        """The plausible candidates' indices, host data, read with the members' choices: they
        are among the top `_PEEK` unless the `_PEEK`-th is plausible too (a very flat
        distribution), and only then is the whole mask read."""
        peek = min(_PEEK, probs.shape[0])
        values, ids = torch.topk(probs, peek)
        plausible = self._plausible(values)  # values[0] is the maximum: the same cut as the whole
        numbers = step.read_with_summaries(torch.cat([plausible.double(), ids.double()]))
        if peek < probs.shape[0] and numbers[peek - 1]:
            return torch.nonzero(self._plausible(probs)).flatten().cpu().numpy()
        return np.asarray([int(i) for keep, i in zip(numbers[:peek], numbers[peek:], strict=True) if keep], np.int64)

    def _plausible(self, probs: torch.Tensor) -> torch.Tensor:
        """The expert's plausible candidates (a mask): at least `alpha` times its best."""
        return probs >= self.alpha * probs.max()

    def _scores(self, own: torch.Tensor, theirs: torch.Tensor | None) -> torch.Tensor:
        """log p_e + beta (log p_e - log p_a), the contrast 0 where the amateur sits out or gives
        the text no probability; float64, so float32 rounding makes no ties."""
        scores = own.double().log()
        if theirs is None:
            return scores
        theirs = theirs.double()
        return scores + self.beta * torch.where(theirs > 0, scores - theirs.clamp(min=1e-300).log(), 0.0)
