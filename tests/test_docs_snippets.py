"""Every Python snippet of README.md and docs/ runs as written (the site itself is built by
`make docs`, strictly, in CI).

Each ```python block runs in this worker's process, as a fresh `python` would run it (`__main__`,
from the repository root), so the packaged models it loads are the ones this worker already
holds (`HFMember.from_pretrained` shares a loaded model: members/loaded.py) instead of a cold
load per snippet. What a snippet changes in the process (`sys.path`, the working folder,
LlamaIndex's global `Settings`) is put back afterwards.

An HTML comment on the line before a block says how else to treat it:

- `<!-- snippet: needs-hub-gpu -->`: it needs the Hugging Face Hub or a GPU. It is compiled and
  its import statements are executed (so a renamed class or module still fails here).
- `<!-- snippet: fragment -->`: a piece of code that cannot run alone; compiled only.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
KINDS = {"run", "needs-hub-gpu", "fragment"}
MARKER = re.compile(r"<!--\s*snippet:\s*([\w-]+)\s*-->")
FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>[\w+-]*)[^\n]*$")
README_MAX_LINES = 250


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # 1-based line of the opening fence
    kind: str
    source: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets_of(path: Path) -> list[Snippet]:
    """The ```python blocks of one Markdown file, with the marker on the line before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, lang = opening["indent"], opening["lang"]
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if lang == "python":
            previous = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
            marked = MARKER.search(previous)
            kind = marked[1] if marked else "run"
            body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[index + 1 : end]]
            found.append(Snippet(path, index + 1, kind, "\n".join(body) + "\n"))
        index = end + 1
    return found


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


SNIPPETS = [snippet for path in documents() for snippet in snippets_of(path)]


def _param(snippet: Snippet):
    marks = []
    if snippet.kind == "run":
        marks.append(pytest.mark.packaged)
        if "RayMember" in snippet.source:
            marks.append(pytest.mark.xdist_group("ray"))
    return pytest.param(snippet, id=f"{snippet.where}-{snippet.kind}", marks=marks)


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., str]]:
    """Runs source as a fresh `python` process would (from the repository root) and returns what
    it printed."""
    from llama_index.core import Settings

    from ensemble_core.methods import METHODS

    saved_settings = dict(vars(Settings))
    saved_methods = dict(METHODS)  # a snippet that registers a method must not leave it behind
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", ["snippet"])
    monkeypatch.chdir(ROOT)

    def run(source: str, where: str) -> str:
        capsys.readouterr()
        exec(compile(source, where, "exec"), {"__name__": "__main__"})
        return capsys.readouterr().out

    yield run
    vars(Settings).clear()
    vars(Settings).update(saved_settings)
    METHODS.clear()
    METHODS.update(saved_methods)


@pytest.fixture(scope="module")
def held_models() -> list[object]:
    """The packaged models the snippets name, loaded once and held for the module, so every
    snippet's `from_pretrained` shares them."""
    from conftest import PACKAGED_NAMES, packaged_member

    return [packaged_member(name) for name in PACKAGED_NAMES]


def test_snippets_were_found() -> None:
    kinds = {snippet.kind for snippet in SNIPPETS}
    assert len(SNIPPETS) >= 20, [s.where for s in SNIPPETS]
    assert kinds <= KINDS, f"unknown snippet markers: {kinds - KINDS} (known: {sorted(KINDS)})"


@pytest.mark.parametrize("snippet", [_param(s) for s in SNIPPETS])
def test_snippet(snippet: Snippet, request: pytest.FixtureRequest) -> None:
    code = compile(snippet.source, snippet.where, "exec")  # every kind must at least compile
    if snippet.kind == "fragment":
        return
    if snippet.kind == "needs-hub-gpu":
        imports = [node for node in ast.parse(snippet.source).body if isinstance(node, ast.Import | ast.ImportFrom)]
        assert imports, f"{snippet.where}: a needs-hub-gpu snippet should import what it uses"
        exec(compile(ast.Module(body=imports, type_ignores=[]), snippet.where, "exec"), {"__name__": "__main__"})
        return
    assert code is not None
    request.getfixturevalue("held_models")
    if "RayMember" in snippet.source:
        request.getfixturevalue("ray_cluster")  # the run's one local Ray cluster
    out = request.getfixturevalue("in_process")(snippet.source, snippet.where)
    assert out.strip(), f"{snippet.where} printed nothing"


def test_readme_is_short() -> None:
    count = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines; the details belong in docs/"


def test_readme_links_exist() -> None:
    """mkdocs checks the links between pages; the README is not a page, so its links are checked here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t]
    missing = [t for t in targets if t and not (ROOT / t).exists()]
    assert not missing, missing


def _hook():
    spec = importlib.util.spec_from_file_location("cli_reference_hook", DOCS / "hooks" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_lists_every_command() -> None:
    from ensemble_core.cli import build_parser

    hook = _hook()
    page = hook.on_page_markdown(f"# CLI\n\n{hook.MARKER}\n", None, None, None)
    assert hook.MARKER not in page
    found = set(re.findall(r"^## `(ensemble-llm[^`]*)`$", page, re.M))
    expected = {"ensemble-llm"} | {f"ensemble-llm {name}" for name, _ in hook._subcommands(build_parser())}
    assert expected <= found, expected - found
    assert "ensemble-llm models prepare" in found
    assert "usage: ensemble-llm serve" in page
