"""The report's statistics: Wilson intervals and the paired sign test."""

from __future__ import annotations

import pytest

from ensemble_core.eval.stats import paired, sign_test, wilson


def test_wilson_intervals_hold_the_share_and_match_known_values() -> None:
    low, high = wilson(31, 40)
    assert low < 31 / 40 < high
    assert (round(low, 3), round(high, 3)) == (0.625, 0.877)  # 77.5% of 40, as tables give it
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)
    assert wilson(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("won", "lost", "p"), [(0, 0, 1.0), (1, 0, 1.0), (5, 0, 0.0625), (6, 0, 0.03125), (7, 3, 0.34375)]
)
def test_the_sign_test_is_the_exact_binomial(won: int, lost: int, p: float) -> None:
    assert sign_test(won, lost) == pytest.approx(p)
    assert sign_test(lost, won) == pytest.approx(p)


def test_a_paired_comparison_counts_only_discordant_problems_both_answered() -> None:
    mine = {"a": True, "b": True, "c": False, "d": True, "e": True}
    best = {"a": True, "b": False, "c": True, "d": False, "f": True}
    result = paired(mine, best)
    assert (result.won, result.lost, result.common) == (2, 1, 4)
    assert result.verdict == "tie"  # 2 vs 1 could be noise
    clear = paired({str(k): True for k in range(8)}, {str(k): False for k in range(8)})
    assert clear.verdict == "better" and clear.p_value < 0.01


def test_an_ensemble_is_compared_with_its_members_under_the_same_boundary_handling() -> None:
    from ensemble_core.eval.records import Record
    from ensemble_core.eval.report import summarise

    def records(config: str, correct: list[bool]) -> list[Record]:
        return [
            Record(config, "f", "t", f"p{k}", ok, None, "", "", "", "", "stop", 1, 0, 1, 1.0, 1)
            for k, ok in enumerate(correct)
        ]

    data = {
        "a alone": [True, False, False, False],
        "a alone [retokenize]": [True, True, True, False],  # better, but under the other handling
        "b alone": [False, False, False, False],
        "gac(a+b)": [True, True, False, False],
    }
    members = {"a alone": ("a",), "a alone [retokenize]": ("a",), "b alone": ("b",), "gac(a+b)": ("a", "b")}
    boundaries = {name: "retokenize" if "retokenize" in name else "correct" for name in data}
    [rows] = summarise([r for name, ok in data.items() for r in records(name, ok)], members, boundaries).values()
    gac = next(row for row in rows if row.config == "gac(a+b)")
    assert gac.best_member == "a alone" and (gac.versus_best.won, gac.versus_best.lost) == (1, 0)
