"""The evaluation's logic (records, resume, report, plots, calibration) on tiny random-weight
members with the real tokenizers of SmolLM2 and Gemma: what the runner does depends on what
members reply, not on how good the replies are. One short run on the real packaged models
checks the default loader's path end to end."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ensemble_core import HFMember
from ensemble_core.errors import ConfigError
from ensemble_core.eval.calibrate import Calibration, write_calibrated
from ensemble_core.eval.config import TaskSpec, build_config, load_config
from ensemble_core.eval.output import write_report
from ensemble_core.eval.runner import Evaluation

MEMBERS = {"smol": "smollm2-135m-instruct", "gemma": "gemma-3-270m"}
TINY_OF = {"smollm2-135m-instruct": "tiny-llama", "gemma-3-270m": "tiny-gemma3"}  # the same tokenizers


def smoke(out: Path, **changes) -> dict:
    return {
        "members": MEMBERS,
        "output": str(out),
        "batch_size": 2,
        "tasks": [
            {"task": "arithmetic", "problems": 3, "max_new_tokens": 12},
            {"task": "arc_challenge", "style": "options", "problems": 3},
        ],
        "configurations": [
            {"members": ["smol", "gemma"], "method": "single"},
            {"members": ["smol", "gemma"], "method": "gac"},
        ],
        **changes,
    }


class CountingLoader:
    """Tiny random-weight members standing in for the config's models, counting loads (a resumed
    run that has nothing to do loads none)."""

    def __init__(self, tiny_member) -> None:
        self.loads: list[str] = []
        self._tiny_member = tiny_member

    def __call__(self, alias: str, model: str) -> HFMember:
        self.loads.append(alias)
        loaded = self._tiny_member(TINY_OF[model])
        return HFMember(loaded.model, loaded.tokenizer, name=alias)  # the same weights, under the alias


@pytest.fixture
def loader(tiny_member) -> CountingLoader:
    return CountingLoader(tiny_member)


def test_an_evaluation_writes_one_record_per_configuration_task_and_problem(
    tmp_path: Path, loader, tiny_member
) -> None:
    config = build_config(smoke(tmp_path))
    records = Evaluation(config, quiet=True, loader=loader).run()
    keys = {(r.config, r.task, r.item) for r in records}
    assert len(keys) == 3 * 2 * 3  # smol alone, gemma alone, gac x two tasks x three problems
    arithmetic = [r for r in records if r.task == "arithmetic:raw:seed0:max12"]
    assert all(
        r.tokens > 0 and r.batch_seconds > 0 and r.finish_reason in ("stop", "length", "eos") for r in arithmetic
    )
    gac = [r for r in arithmetic if r.config == "gac(smol+gemma)"]
    assert all(0.0 <= r.share_ensembled <= 1.0 and r.method_stats["steps"] > 0 for r in gac)
    assert set(gac[0].member_seconds) == {"smol", "gemma"}
    options = [r for r in records if r.task == "arc_challenge:options"]
    assert all(len(r.options) == 4 and abs(sum(r.options) - 1) < 1e-4 and r.tokens == 0 for r in options)
    assert all(r.correct == (r.reply.strip() == r.answer) for r in options)
    assert sorted(set(loader.loads)) == ["gemma", "smol"]  # each member loaded once for every configuration

    again = CountingLoader(tiny_member)
    Evaluation(config, quiet=True, loader=again).run()
    assert again.loads == []  # everything is on file: nothing runs

    path = write_report(config, records, "ensemble-llm eval --config smoke.yaml")
    report = path.read_text()
    assert "## arithmetic:raw:seed0:max12" in report and "## arc_challenge:options" in report
    assert "vs smol alone" in report or "vs gemma alone" in report
    assert (tmp_path / "plots" / "arithmetic_raw_seed0_max12-accuracy.png").stat().st_size > 1000
    assert "](plots/arithmetic_raw_seed0_max12-cost.png)" in report

    # A narrower slice over the same folder reports on its own problems, not on all on file.
    narrower = build_config(smoke(tmp_path, tasks=[{"task": "arithmetic", "problems": 2, "max_new_tokens": 12}]))
    report = write_report(narrower, records, "ensemble-llm eval", plots=False).read_text()
    totals = re.findall(r"\| \d+/(\d+) = ", report)
    assert totals == ["2"] * 3 and "arc_challenge" not in report


def test_an_interrupted_evaluation_resumes_where_it_stopped(tmp_path: Path, tiny_member) -> None:
    config = build_config(smoke(tmp_path, configurations=[{"members": ["smol"], "method": "single"}]))
    Evaluation(config, quiet=True, loader=CountingLoader(tiny_member)).run()
    path = tmp_path / "records.jsonl"
    lines = path.read_text().splitlines()
    kept, lost = lines[:2], json.loads(lines[2])
    path.write_text("\n".join(kept) + "\n" + lines[2][:40])  # killed while writing the third record
    loader = CountingLoader(tiny_member)
    records = Evaluation(config, quiet=True, loader=loader).run()
    assert loader.loads == ["smol"]
    assert len(records.records) == len(lines)
    redone = records.records[(lost["config"], lost["task"], lost["item"])]
    assert redone.reply == lost["reply"]  # greedy: the same problem gives the same reply again


def test_a_changed_configuration_under_an_old_name_is_refused(tmp_path: Path, tiny_member) -> None:
    first = build_config(smoke(tmp_path, configurations=[{"name": "mine", "members": ["smol"]}]))
    Evaluation(first, quiet=True, loader=CountingLoader(tiny_member)).run()
    changed = build_config(smoke(tmp_path, configurations=[{"name": "mine", "members": ["gemma"]}]))
    with pytest.raises(ConfigError, match="different definition"):
        Evaluation(changed, quiet=True, loader=CountingLoader(tiny_member)).cells()


def test_calibration_picks_on_a_held_out_slice_and_writes_the_choice_into_the_yaml(tmp_path: Path, tiny_member) -> None:
    source = tmp_path / "eval.yaml"
    data = smoke(tmp_path / "results", tasks=[{"task": "arc_challenge", "style": "options", "problems": "0-2"}])
    data["configurations"] = [{"name": "pair", "members": ["smol", "gemma"], "method": "gac"}]
    source.write_text(yaml.safe_dump(data))
    config = load_config(source)
    with pytest.raises(ConfigError, match="overlaps"):
        Calibration(config, "pair", TaskSpec(task="arc_challenge", style="options", problems="2-4"), tmp_path)
    with pytest.raises(ConfigError, match="No configuration named"):
        Calibration(config, "trio", TaskSpec(task="arc_challenge", style="options", problems="10-13"), tmp_path)
    held_out = TaskSpec(task="arc_challenge", style="options", problems="10-11")
    calibration = Calibration(
        config, "pair", held_out, tmp_path / "calibration", quiet=True, loader=CountingLoader(tiny_member)
    )
    chosen, rows = calibration.run()
    assert len(rows) == 9  # GaC has no role setting: equal, two rules, each member leading at 0.5/0.7/0.9
    assert all(row.total == 2 for row in rows)
    shown = str(chosen.weights or "equal")
    chosen_row = next(row for row in rows if row.config.split(": ", 1)[1] == shown)
    assert chosen_row.correct == max(row.correct for row in rows)  # the best on the held-out slice
    target = tmp_path / "eval.calibrated.yaml"
    write_calibrated(source, chosen, rows, target, held_out)
    written = load_config(target)  # still a valid config, the calibrated configuration added
    assert [c.label() for c in written.configurations] == ["pair", "pair calibrated"]
    assert written.configurations[1].weights == chosen.weights
    assert target.read_text().startswith("# calibrated on arc_challenge:options@10-11")

    # Calibrating again on another slice of the task, into the same folder, counts that slice only.
    other = TaskSpec(task="arc_challenge", style="options", problems="12-14")
    _, again = Calibration(
        config, "pair", other, tmp_path / "calibration", quiet=True, loader=CountingLoader(tiny_member)
    ).run()
    assert [row.total for row in again] == [3] * 9


def test_calibration_can_try_a_subset_of_the_weightings_under_their_full_search_names(
    tmp_path: Path, tiny_member
) -> None:
    """`--weights` trims the search to fit the time; each candidate keeps the name (and so the
    records) it has in the full search."""
    data = smoke(tmp_path / "results", tasks=[{"task": "arc_challenge", "style": "options", "problems": "0-2"}])
    data["configurations"] = [{"name": "pair", "members": ["smol", "gemma"], "method": "gac"}]
    config = build_config(data)
    held_out = TaskSpec(task="arc_challenge", style="options", problems="10-11")
    with pytest.raises(ConfigError, match=r"does not have: \['smol:0.8'\]; pick from \['equal', 'prompt'"):
        Calibration(config, "pair", held_out, tmp_path / "calibration", weights=["equal", "smol:0.8"])
    with pytest.raises(ConfigError, match="names no weighting"):
        Calibration(config, "pair", held_out, tmp_path / "calibration", weights=[])
    subset = ["equal", "smol:0.9"]
    chosen, rows = Calibration(
        config,
        "pair",
        held_out,
        tmp_path / "calibration",
        quiet=True,
        loader=CountingLoader(tiny_member),
        weights=subset,
    ).run()
    assert [row.config for row in rows] == ["weights 0: equal", "weights 5: [0.9, 0.1]"]
    assert chosen.weights in (None, [0.9, 0.1])


def test_sweetspan_calibrates_its_self_scores_together_with_numeric_weights(tmp_path: Path, tiny_member) -> None:
    """SweetSpan's role setting (whether members' scores of their own spans count) is tried with
    every weighting, as the two interact; its weights are numbers (the rules read token
    distributions, which it does not combine)."""
    data = smoke(tmp_path / "results", tasks=[{"task": "arc_challenge", "style": "options", "problems": "0-2"}])
    data["configurations"] = [{"name": "spans", "members": ["smol", "gemma"], "method": "sweetspan"}]
    config = build_config(data)
    held_out = TaskSpec(task="arc_challenge", style="options", problems="10-11")
    chosen, rows = Calibration(
        config, "spans", held_out, tmp_path / "calibration", quiet=True, loader=CountingLoader(tiny_member)
    ).run()
    labels = [row.config for row in rows]
    assert len(labels) == 2 * (1 + 2 * 3)  # both self-score settings x (equal, each member leading)
    assert labels[0] == "weights 0: equal, self_score=False" and labels[7] == "weights 0: equal, self_score=True"
    assert not any("prompt" in label or "agreement" in label for label in labels)
    assert chosen.method == "sweetspan" and "self_score" in chosen.params


@pytest.mark.packaged
def test_a_short_evaluation_on_the_real_models_through_the_default_loader(tmp_path: Path) -> None:
    """The runner's own loader (`HFMember.from_pretrained` with the config's device and dtype) on
    the real SmolLM2 and Gemma: two problems, one ensemble, its report."""
    data = smoke(tmp_path, dtype="auto", tasks=[{"task": "arithmetic", "problems": 2, "max_new_tokens": 12}])
    data["configurations"] = [{"members": ["smol", "gemma"], "method": "gac"}]
    config = build_config(data)
    records = list(Evaluation(config, quiet=True).run())
    assert [r.item for r in records] == [item.id for item in config.selections[0][1]]
    for record in records:
        assert record.config == "gac(smol+gemma)" and record.reply.strip()
        assert record.tokens > 0 and set(record.member_seconds) == {"smol", "gemma"}
        assert all(seconds > 0 for seconds in record.member_seconds.values())
    report = write_report(config, Evaluation(config, quiet=True).run(), "ensemble-llm eval", plots=False).read_text()
    assert "## arithmetic:raw:seed0:max12" in report and "gac(smol+gemma)" in report
