"""The statistics a report needs: an interval for an accuracy, and a paired comparison.

A difference of one or two problems on 40 is noise. Accuracies come with a 95% Wilson interval;
a configuration is compared with its best member on the SAME problems (problems it solves that
the member does not, and the reverse), with an exact two-sided sign test on those discordant
pairs (McNemar's exact test): p < 0.05 is called a win or a loss, anything else a tie.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

Z_95 = 1.959963984540054


def wilson(correct: int, total: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for `correct` out of `total` (95% by default)."""
    if total == 0:
        return (0.0, 1.0)
    share = correct / total
    denominator = 1 + z * z / total
    centre = (share + z * z / (2 * total)) / denominator
    half = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Paired:
    """A configuration against a reference on the problems both answered.

    Attributes:
        won: problems the configuration got right and the reference wrong.
        lost: the reverse.
        common: problems compared.
        p_value: exact two-sided sign test on won vs lost.
    """

    won: int
    lost: int
    common: int
    p_value: float

    @property
    def verdict(self) -> str:
        """ "better" / "worse" (p < 0.05) or "tie"."""
        if self.p_value >= 0.05 or self.won == self.lost:
            return "tie"
        return "better" if self.won > self.lost else "worse"


def sign_test(won: int, lost: int) -> float:
    """Exact two-sided binomial test of won vs lost at p = 1/2."""
    pairs = won + lost
    if pairs == 0:
        return 1.0
    tail = sum(math.comb(pairs, k) for k in range(min(won, lost) + 1)) / 2**pairs
    return min(1.0, 2 * tail)


def paired(candidate: Mapping[str, bool], reference: Mapping[str, bool]) -> Paired:
    """Compare per-problem correctness on the problems both have."""
    common = candidate.keys() & reference.keys()
    won = sum(1 for key in common if candidate[key] and not reference[key])
    lost = sum(1 for key in common if reference[key] and not candidate[key])
    return Paired(won, lost, len(common), sign_test(won, lost))
