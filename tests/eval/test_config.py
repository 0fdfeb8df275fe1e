"""Evaluation configs: every mistake is a named error before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from ensemble_core.errors import ConfigError, UnknownNameError
from ensemble_core.eval.config import build_config, load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def config(**changes) -> dict:
    base = {
        "tasks": [{"task": "arithmetic", "problems": 3}],
        "configurations": [
            {"members": ["smol", "gemma"], "method": "single"},
            {"members": ["smol", "gemma"], "method": "gac"},
        ],
    }
    return {**base, **changes}


def test_single_over_several_members_means_each_member_alone() -> None:
    checked = build_config(config())
    assert [spec.label() for spec in checked.expanded()] == ["smol alone", "gemma alone", "gac(smol+gemma)"]


def test_a_changed_definition_changes_the_fingerprint() -> None:
    checked = build_config(config())
    [_, _, gac] = checked.expanded()
    other = build_config(
        config(configurations=[{"members": ["smol", "gemma"], "method": "gac", "boundary": "retokenize"}])
    )
    assert checked.fingerprint(gac) != other.fingerprint(other.expanded()[0])
    assert other.expanded()[0].label() == "gac(smol+gemma) [retokenize]"


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"taks": []}, ConfigError, "`taks` is not a known key"),
        ({"tasks": [{"task": "gsm9k"}]}, UnknownNameError, "Unknown task 'gsm9k'"),
        ({"tasks": [{"task": "gsm8k", "style": "shouty"}]}, ConfigError, "no style 'shouty'"),
        ({"tasks": [{"task": "gsm8k", "problems": "0-5000"}]}, ConfigError, "outside 0-1318"),
        ({"configurations": [{"members": ["smoll"], "method": "single"}]}, UnknownNameError, "Unknown member 'smoll'"),
        ({"configurations": [{"members": ["smol"], "method": "gack"}]}, UnknownNameError, "Unknown method 'gack'"),
        (
            {"configurations": [{"members": ["smol"], "method": "gac", "params": {"treshold": 1}}]},
            ConfigError,
            "treshold",
        ),
        ({"configurations": [{"members": ["smol", "smol"], "method": "gac"}]}, ConfigError, "lists a member twice"),
        (
            {"configurations": [{"members": ["qwen", "smol", "gemma"], "method": "contrastive"}]},
            ConfigError,
            "`contrastive` takes two members, an expert and an amateur, but the ensemble has 3",
        ),
        ({"configurations": [{"members": ["qwen"], "method": "safe"}]}, ConfigError, "SAFE needs at least two"),
        (  # a role naming no member of its row fails when the file is read, not when its cell starts
            {"configurations": [{"members": ["qwen", "smol"], "method": "safe", "params": {"drafter": "qwne"}}]},
            UnknownNameError,
            "`drafter` is 'qwne', but the ensemble's members are 'qwen', 'smol'",
        ),
        (
            {"configurations": [{"members": ["qwen", "smol"], "method": "gac", "weights": [0.5, 0.3, 0.2]}]},
            ConfigError,
            "`weights` has 3 entries, but the ensemble has 2 members",
        ),
        ({"batch_size": 0}, ConfigError, "batch_size"),
    ],
)
def test_bad_configs_fail_with_the_field_named(changes: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        build_config(config(**changes))


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("tasks: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml is not valid YAML"):
        load_config(broken)
    with pytest.raises(ConfigError, match="No evaluation config"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "name",
    sorted(
        str(path.relative_to(ROOT))
        for path in [*EXAMPLES.glob("eval*.yaml"), *(ROOT / "docs" / "results").glob("**/config.yaml")]
    ),
)
def test_the_example_configs_are_valid(name: str) -> None:
    """The general examples, and each published report's config (beside its report)."""
    checked = load_config(ROOT / name)
    assert checked.expanded() and checked.tasks
    if name.startswith("docs"):  # run from the repository's root, it writes its records beside its report
        assert checked.output == Path(name).parent


def test_the_python_api_names_resolve_to_the_command_lines_own_objects() -> None:
    import ensemble_core.eval as api
    from ensemble_core.eval.config import load_config
    from ensemble_core.eval.runner import Evaluation

    assert api.load_config is load_config and api.Evaluation is Evaluation
    assert all(getattr(api, name) is not None for name in api.__all__)
    with pytest.raises(AttributeError, match="no attribute 'evaluate'"):
        _ = api.evaluate
