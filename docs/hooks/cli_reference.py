"""mkdocs hook: the command-line reference, generated from the parser the command itself uses.

`docs/reference/cli.md` holds the marker `<!-- cli-reference -->`; at build time it is replaced
by the `--help` text of `ensemble-llm` and of every subcommand, found by walking the subparsers
of `ensemble_core.cli.build_parser()`. Nothing else about the CLI is assumed, so the page stays
true whatever the options are.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

MARKER = "<!-- cli-reference -->"
WIDTH = "100"  # argparse wraps help to $COLUMNS: fix it, so the page does not depend on the terminal


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse has no public walk over subparsers
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    yield path, parser.format_help()
    for name, sub in _subcommands(parser):
        yield from _walk(sub, (*path, name))


def cli_reference() -> str:
    """The reference as Markdown: one section per command, its help in a code block."""
    from ensemble_core.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        parser.prog = "ensemble-llm"
        sections = []
        for path, text in _walk(parser, ("ensemble-llm",)):
            title = " ".join(path)
            sections.append(f"## `{title}`\n\n```text\n{text.rstrip()}\n```\n")
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(sections)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())
