"""Next-byte prediction at arbitrary cut points: does it matter where the text stops?

    python benchmarks/bench_boundary.py [--problems 40] [--bytes 2000]

For each packaged member, texts it did not write (HumanEval prompts + canonical solutions of the
first problems, and prose paragraphs) are committed to it one byte at a time, as text written
by someone else. After every byte the member is asked for its next step; its most likely next
byte (the masses of every candidate grouped by its first byte) is compared with the true one.
Cuts are split into "at a token boundary of that member" (its own tokenisation of the whole
text has a boundary there) and "inside one of its tokens", with boundary="retokenize" (re-encode
and predict the next whole token) and the default boundary="correct" (docs/explanation/prompt-boundary.md). All
texts of a member run as one batch (one forward per step). Greedy, bf16, 2 CPU threads.
Goal: with the correction, accuracy inside tokens within 2 points of accuracy at boundaries.

Cuts inside and at boundaries are not equally hard: in byte-level BPE a space starts the next
word's token, so "inside" holds every word start (the hardest bytes) and "at" every word end.
So the table also compares like with like: per kind of cut (what byte precedes and follows:
letter, digit, space, newline, punctuation, non-ASCII), the kinds that occur both at boundaries
and inside tokens, the accuracy at boundaries over those kinds against the inside accuracy
re-weighted to the boundary cuts' mix of them. Letters and digits are kept apart: Qwen splits
every digit off (a boundary between a space and a digit), while a space and the letter after
it are always inside one of its tokens (" word"), and the first letter of the next word is
the hardest byte to predict.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NAMES = ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m")
PROSE = [
    "The lighthouse stood at the end of a long stone pier, its white paint flaking in the salt wind. "
    "Every evening the keeper climbed the hundred and twelve steps, trimmed the wick, and wound the "
    "clockwork that turned the great lens, while the gulls settled on the railings below.",
    "Rivers carry more than water. They move sand and silt from the mountains to the sea, cut valleys "
    "through solid rock over millions of years, and build deltas where their currents finally slow "
    "down. Cities have grown along their banks for as long as people have farmed.",
    "To make bread, mix flour, water, salt and a little yeast, then knead the dough until it is smooth "
    "and elastic. Let it rise in a warm place for about an hour, shape it into a loaf, and bake it at "
    "a high temperature until the crust is brown and sounds hollow when tapped.",
    "The committee met on Tuesday to discuss the budget for the coming year. After a long debate, "
    "members agreed to increase spending on libraries and parks by four percent, while the proposal "
    "to build a new stadium was postponed until a study of its costs is complete.",
    "Octopuses are remarkable animals. They have three hearts, blue blood, and eight arms lined with "
    "suckers that can taste as well as touch. Many species change colour in a fraction of a second, "
    "and some use coconut shells or rocks as portable shelters.",
    "When the train finally pulled into the station, it was nearly midnight. The platform was empty "
    "except for a porter sweeping beneath the clock, and the only sound was the hiss of the engine "
    "cooling in the damp night air.",
]


def texts(problems: int) -> list[tuple[str, str]]:
    """(kind, text) pairs: code, then prose."""
    from ensemble_core.eval.tasks.humaneval import load_problems

    code = [("code", p.prompt + p.canonical_solution) for p in load_problems()[:problems]]
    return code + [("prose", t) for t in PROSE]


def first_bytes(member):
    """Per id, the first byte it spells (-1: no text, or an end-of-sequence id)."""
    import torch

    values = [
        (spelled[0] if spelled and token not in member.eos_token_ids else -1)
        for token, spelled in enumerate(member.table.token_bytes)
    ]
    values += [-1] * (member.logits_width - len(values))
    return torch.tensor(values, dtype=torch.long)


def next_byte(member, distribution, first) -> int:
    """The most likely next byte under a member's distribution over continuations."""
    import torch

    bins = torch.zeros(257, dtype=torch.float32)
    dense = distribution.dense.float()
    targets = torch.where(first[: dense.shape[0]] >= 0, first[: dense.shape[0]], 256)
    bins.index_add_(0, targets, dense)
    for group in distribution.partial:
        table = member.table.token_bytes
        suffix_first = torch.tensor([table[t][group.skip] for t in group.token_ids.tolist()], dtype=torch.long)
        bins.index_add_(0, suffix_first, group.probs.float())
    return int(torch.argmax(bins[:256]))


def boundaries(member, text: bytes) -> set[int]:
    """Byte offsets where the member's own tokenisation of the whole text has a boundary."""
    ids = member.vocab.encode(text) or []
    found, position = {0}, 0
    for token in ids:
        position += len(member.table.token_bytes[token] or b"")
        found.add(position)
    return found


def _byte_kind(value: int) -> str:
    if value >= 0x80:
        return "non-ascii"
    char = chr(value)
    if char.isalpha():
        return "letter"
    if char.isdigit():
        return "digit"
    return "space" if char in " \t" else "newline" if char in "\r\n" else "punct"


def _cut_kind(text: bytes, at: int) -> str:
    return f"{_byte_kind(text[at - 1])}|{_byte_kind(text[at])}"


def measure(
    member, boundary: str, corpus: list[tuple[str, bytes]], limit: int
) -> dict[tuple[str, str, str], list[int]]:
    """Per (text kind, at-boundary or inside, kind of cut): [hits, cuts]."""
    from ensemble_core.members.contract import Boundary, RequestId

    first = first_bytes(member)
    requests = {RequestId(k + 1): text[:limit] for k, (_, text) in enumerate(corpus)}
    kinds = {RequestId(k + 1): kind for k, (kind, _) in enumerate(corpus)}
    cuts = {rid: boundaries(member, text) for rid, text in requests.items()}
    prompts = {rid: member.render(text[:1].decode("utf-8", errors="ignore") or "a") for rid, text in requests.items()}
    session = member.start(prompts, Boundary(boundary))
    counts: dict[tuple[str, str, str], list[int]] = {}
    position = {rid: 1 for rid in requests}
    active = list(requests)
    while active:
        for rid in active:
            session.commit(rid, requests[rid][position[rid] : position[rid] + 1])
            position[rid] += 1
        found = session.next(active)
        for rid, distribution in zip(active, found, strict=True):
            text, at = requests[rid], position[rid]
            if at >= len(text) or distribution is None:
                continue
            where = "boundary" if at in cuts[rid] else "inside"
            tally = counts.setdefault((kinds[rid], where, _cut_kind(text, at)), [0, 0])
            tally[0] += int(next_byte(member, distribution, first) == text[at])
            tally[1] += 1
        done = [rid for rid in active if position[rid] >= len(requests[rid])]
        if done:
            session.drop(done)
            active = [rid for rid in active if rid not in done]
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=40, help="HumanEval problems 0..N-1 (prompt + solution)")
    parser.add_argument("--bytes", type=int, default=2000, help="cut each text at most this long")
    parser.add_argument("--members", nargs="*", default=list(NAMES))
    args = parser.parse_args()

    from transformers.utils import logging as hf_logging

    from ensemble_core import HFMember

    hf_logging.disable_progress_bar()
    corpus = [(kind, text.encode()) for kind, text in texts(args.problems)]
    print(
        f"next-byte accuracy; {args.problems} HumanEval prompts + solutions and {len(PROSE)} prose paragraphs, "
        f"every byte a cut (up to {args.bytes} per text); bf16, {os.cpu_count()} CPU threads"
    )
    print(
        "| member | text | cuts at its boundaries | cuts inside its tokens | retokenize: at / inside (gap) "
        "| correct: at / inside (gap) | correct, like for like: at / inside re-weighted (gap) "
        "| seconds retok / correct |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.members:
        member = HFMember.from_pretrained(name, device="cpu")
        results, seconds = {}, {}
        for boundary in ("retokenize", "correct"):
            started = time.perf_counter()
            results[boundary] = measure(member, boundary, corpus, args.bytes)
            seconds[boundary] = time.perf_counter() - started
        for kind in ("code", "prose", "all"):
            cells = []
            for boundary in ("retokenize", "correct"):
                at = _accuracy(results[boundary], kind, "boundary")
                inside = _accuracy(results[boundary], kind, "inside")
                cells.append(f"{at[0]:.1%} / {inside[0]:.1%} ({(at[0] - inside[0]) * 100:+.1f})")
            at, inside = _accuracy(results["correct"], kind, "boundary"), _accuracy(results["correct"], kind, "inside")
            same_at, same_inside = _like_for_like(results["correct"], kind)
            timing = f"{seconds['retokenize']:.0f} / {seconds['correct']:.0f}" if kind == "all" else ""
            print(
                f"| {name} | {kind} | {at[1]} | {inside[1]} | {cells[0]} | {cells[1]} "
                f"| {same_at:.1%} / {same_inside:.1%} ({(same_at - same_inside) * 100:+.1f}) | {timing} |"
            )
        del member


def _accuracy(counts: dict[tuple[str, str, str], list[int]], kind: str, where: str) -> tuple[float, int]:
    hits = total = 0
    for (k, w, _), (h, n) in counts.items():
        if w == where and (kind == "all" or k == kind):
            hits, total = hits + h, total + n
    return (hits / total if total else 0.0), total


def _like_for_like(counts: dict[tuple[str, str, str], list[int]], kind: str) -> tuple[float, float]:
    """(accuracy at boundaries, inside accuracy re-weighted to the boundary cuts' mix), both over
    the kinds of cut found at boundaries and at least 5 times inside tokens."""
    at: dict[str, list[int]] = {}
    inside: dict[str, list[int]] = {}
    for (k, w, cut), (h, n) in counts.items():
        if kind != "all" and k != kind:
            continue
        tally = (at if w == "boundary" else inside).setdefault(cut, [0, 0])
        tally[0], tally[1] = tally[0] + h, tally[1] + n
    shared = [cut for cut in at if inside.get(cut, [0, 0])[1] >= 5]
    weight = sum(at[cut][1] for cut in shared)
    if not weight:
        return 0.0, 0.0
    at_accuracy = sum(at[cut][0] for cut in shared) / weight
    return at_accuracy, sum(at[cut][1] * inside[cut][0] / inside[cut][1] for cut in shared) / weight


if __name__ == "__main__":
    main()
