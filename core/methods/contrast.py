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
scores exactly log p_e (the contrast is exactly 0), and beta = 0 is the expert alone. Their
defaults, beta = 0.5 and alpha = 0.1, are ours: nothing here was tuned on our evaluation.

Candidates are texts, as for every token-level method (boundary-corrected distributions over
the union vocabulary), so the members need not share a tokenizer; but the rule is meant for
members of one family, whose probabilities of one text compare. A plausible text the amateur
cannot write in one step (probability 0: its tokens split it differently) gets no contrast
term, rather than an unbounded bonus for a vocabulary accident.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ensemble_core.errors import ConfigError
from ensemble_core.members.contract import MemberVocab, RequestId
from ensemble_core.methods.base import Binding, DecodeState, bind_all, check_fraction, register, role_index
from ensemble_core.methods.combine import Scored, Step
from ensemble_core.methods.token import TokenMethod, TokenStats


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
        expert = max(step.raw, key=lambda m: step.weights[m])
        amateurs = [m for m in step.raw if m != expert]
        if not amateurs:  # the amateur has no tokens for the committed text: the expert alone
            scored = step.full_scored()
            return step.choose(scored, state.settings, state.generators.get(request))
        scored = self.contrast(step, expert, amateurs[0])
        if state.settings.greedy or state.generators.get(request) is None:
            return step.pick(scored)
        probabilities = Scored(scored.entries, torch.softmax(scored.probs, dim=0))
        return step.choose(probabilities, state.settings, state.generators.get(request))

    def contrast(self, step: Step, expert: int, amateur: int) -> Scored:
        """The expert's plausible entries (in text order) with their contrastive scores."""
        expert_probs, amateur_probs = step.each_full([expert, amateur])
        entries = torch.nonzero(expert_probs >= self.alpha * expert_probs.max()).flatten()
        entries = step.in_text_order(entries)
        own = expert_probs[entries].double().log()
        theirs = amateur_probs[entries].double()
        contrast = torch.where(theirs > 0, own - theirs.clamp(min=1e-300).log(), torch.zeros_like(own))
        return Scored(entries, own + self.beta * contrast)  # float64: no ties float32 rounding would make
