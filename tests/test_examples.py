"""The examples run as written (examples/README.md promises it; README.md's and docs/'s snippets:
tests/test_docs_snippets.py).

Each offline example runs in this worker's process, as `python examples/<name>.py` would run it
(`__main__`, its own folder first on `sys.path`), so the models it loads are the ones this
worker already holds (`HFMember.from_pretrained` shares a loaded model: members/loaded.py)
instead of a cold process loading all three again. What an example changes in the process
(`sys.path`, LlamaIndex's global `Settings`) is put back afterwards. An example that needs the
Hugging Face Hub and a GPU is only compiled, and its imports run. examples/README.md lists them
all.
"""

from __future__ import annotations

import ast
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
    """Runs a script as a fresh `python` process would and returns what it printed."""
    from llama_index.core import Settings

    saved_settings = dict(vars(Settings))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(ROOT)

    def run(script: Path) -> str:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", [str(script)])
        sys.path.insert(0, str(script.parent))
        runpy.run_path(str(script), run_name="__main__")
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
    "auto_weights.py": ['weights="auto": qwen2.5-coder-0.5b-instruct '],
    "evaluate.py": ["# Evaluation report", "| gac(qwen+smol) w=auto |"],
    "calibrate.py": ["weights 5: [0.9, 0.1]: ", "chosen: gac(qwen+smol) calibrated"],
}
ON_RAY = {"ray_members.py": ["the same text as with both in this process: True"]}
NEEDS_HUB_AND_GPU = ["gpu_hub_langchain.py"]  # compiled, and its imports run
HELPERS = ["offline_embeddings.py"]  # imported by the RAG examples


def test_every_example_is_tested_and_listed_in_the_examples_readme() -> None:
    scripts = sorted(path.name for path in EXAMPLES.glob("*.py"))
    assert scripts == sorted([*EXPECTED, *ON_RAY, *NEEDS_HUB_AND_GPU, *HELPERS])
    table = (EXAMPLES / "README.md").read_text()
    listed = set(re.findall(r"\[`?(\w+\.py)`?\]\(", table))
    assert listed == set(scripts), "examples/README.md links each example once"


@pytest.mark.parametrize("script", sorted(path.name for path in EXAMPLES.glob("*.py")))
def test_no_example_edits_sys_path(script: str) -> None:
    """`python examples/NAME.py` already puts examples/ first on `sys.path`."""
    tree = ast.parse((EXAMPLES / script).read_text())
    uses = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "path"]
    assert not [node for node in uses if isinstance(node.value, ast.Name) and node.value.id == "sys"]


@pytest.mark.parametrize("script", NEEDS_HUB_AND_GPU)
def test_the_hub_and_gpu_examples_compile_and_their_imports_run(script: str) -> None:
    path = EXAMPLES / script
    tree = ast.parse(path.read_text(), str(path))
    compile(tree, str(path), "exec")
    docstring = ast.get_docstring(tree) or ""
    assert "Needs: the Hugging Face Hub" in docstring and "GPU" in docstring, "say so at the top"
    imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert imports
    exec(compile(ast.Module(body=imports, type_ignores=[]), str(path), "exec"), {"__name__": "imports_only"})


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
    if script == "auto_weights.py":
        assert out.count("equal weights: ") == 2 and out.count('weights="auto": ') == 2  # two prompts


@pytest.mark.packaged
@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("script", list(ON_RAY))
def test_ray_example_runs(script: str, in_process, ray_cluster) -> None:
    """On the run's one local Ray cluster (the example starts Ray only where none runs)."""
    out = in_process(EXAMPLES / script)
    for shown in ON_RAY[script]:
        assert shown in out, out
