"""The examples and the README's snippets run as written (the README promises it).

Each runs in this worker's process, as `python examples/<name>.py` would run it (`__main__`,
its own folder first on `sys.path`), so the models it loads are the ones this worker already
holds (`HFMember.from_pretrained` shares a loaded model: members/loaded.py) instead of a cold
process loading all three again. What an example changes in the process (`sys.path`,
LlamaIndex's global `Settings`) is put back afterwards.
"""

from __future__ import annotations

import re
import runpy
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Iterator[Callable]:
    """Runs code as a fresh `python` process would and returns what it printed."""
    from llama_index.core import Settings

    saved_settings = dict(vars(Settings))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(ROOT)

    def run(script: Path | None = None, source: str | None = None) -> str:
        capsys.readouterr()
        if script is not None:
            monkeypatch.setattr(sys, "argv", [str(script)])
            sys.path.insert(0, str(script.parent))
            runpy.run_path(str(script), run_name="__main__")
        else:
            exec(compile(source or "", "<README snippet>", "exec"), {"__name__": "__main__"})
        return capsys.readouterr().out

    yield run
    vars(Settings).clear()
    vars(Settings).update(saved_settings)


EXPECTED = {
    # script: what its output must show beyond some text
    "quickstart.py": [],
    "demo.py": [],
    "token_ensembles.py": [],
    "span_ensembles.py": [],
    "langchain_chain.py": ["=== streamed answer", "share of tokens decided"],
    "langchain_rag.py": [],
    "langchain_agent.py": ["[tool] "],  # the Python tool ran on the call the model made
    "llamaindex_query_engine.py": ["source: "],  # the answer came with the retrieved documents
    "llamaindex_chat_engine.py": [],
    "llamaindex_agent.py": ["tool result: "],  # the Python tool ran on the call the model made
    "serve_chatopenai.py": ["=== streamed through ChatOpenAI", "share of tokens decided"],
}


@pytest.mark.packaged
@pytest.mark.parametrize("script", list(EXPECTED))
def test_example_runs(script: str, in_process) -> None:
    out = in_process(EXAMPLES / script)
    assert out.strip()
    for shown in EXPECTED[script]:
        assert shown in out, out
    if script == "demo.py":
        assert out.count("tokens/s") == 3  # one report per packaged model
    if script == "langchain_chain.py":
        assert "Geners" not in out  # the word Qwen and SmolLM2 split differently (boundary correction)
    if script == "llamaindex_chat_engine.py":
        assert out.count("Assistant: ") >= 2  # a follow-up turn, condensed with the history


def readme_snippet(marker: str) -> str:
    readme = (ROOT / "README.md").read_text()
    [snippet] = [block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if marker in block]
    return snippet


@pytest.mark.packaged
@pytest.mark.parametrize(
    "marker", ["ChatEnsemble(", "EnsembleLLM(", "FakeMember.scripted(", "num_threads=1", "JSONSchema("]
)
def test_readme_snippets_run_as_written(marker: str, in_process) -> None:
    assert in_process(source=readme_snippet(marker)).strip()


@pytest.mark.packaged
@pytest.mark.xdist_group("ray")
def test_readme_ray_snippet_runs_as_written(in_process, ray_cluster) -> None:
    """On the run's one local Ray cluster (the snippet starts Ray only where none runs)."""
    assert in_process(source=readme_snippet("RayMember.from_pretrained(")).strip()
