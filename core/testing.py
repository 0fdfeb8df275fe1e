"""`FakeMember`: a real tokenizer plus a logits function, for tests without any model.

A method's rules are best checked with distributions made by hand (ties, a member that always
wins, one that never agrees, an end of text mid-span). `FakeMember` runs exactly the member
code every `HFMember` runs (rendering with the tokenizer's own chat template, the token trie,
keeping in step with committed text, prompt-boundary correction); only the model is replaced
by a function of the token ids. It needs no torch model and runs in milliseconds.

Example::

    from transformers import AutoTokenizer
    from ensemble_core import Ensemble
    from ensemble_core.testing import FakeMember

    tok = AutoTokenizer.from_pretrained("path/to/any/tokenizer")
    def says_hello(text: str) -> dict[str, float]:
        return {" hello": 0.9, "<eos>": 0.1} if not text.endswith(" hello") else {"<eos>": 1.0}

    member = FakeMember.scripted(tok, "greeter", says_hello)
    Ensemble([member], method="single").generate("Say:", max_new_tokens=4).text  # " hello"
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ensemble_core.errors import ConfigError
from ensemble_core.members.base import TokenizerMember
from ensemble_core.members.session import DEFAULT_TAIL_TOKENS
from ensemble_core.members.token_tree import Backend, Node, TokenTree

LogitsFunction = Callable[[list[int]], "torch.Tensor | Sequence[float]"]
"""Token ids (prompt, then what follows) -> next-token logits, one per id of the logits width."""

END = "<eos>"  # in a script: the member's end-of-sequence token


class FunctionBackend(Backend):
    """Evaluates trie nodes by calling a logits function on each node's ids (no cache)."""

    def __init__(self, logits: LogitsFunction, width: int):
        self._logits = logits
        self._width = width
        self._next_slot = 0

    def evaluate(self, tree: TokenTree, pending: dict[int, list[Node]]) -> None:
        count = 0
        for nodes in pending.values():
            for node in nodes:
                node.slot = self._next_slot
                self._next_slot += 1
                count += 1
                if node.wanted:
                    node.logits = self._call(node.ids())
                    node._lse = None
        tree.stats.forwards += 1
        tree.stats.tokens += count

    def _call(self, ids: list[int]) -> torch.Tensor:
        values = torch.as_tensor(self._logits(list(ids)), dtype=torch.float32)
        if values.shape != (self._width,):
            raise ConfigError(
                f"The logits function returned shape {tuple(values.shape)}; it must return one logit per id "
                f"of the logits width ({self._width})."
            )
        return values


class FakeMember(TokenizerMember):
    """A member whose "model" is a logits function (see the module docstring).

    Args:
        tokenizer: a real Hugging Face tokenizer (its template and ids are used as they are).
        logits: token ids -> next-token logits (a tensor or list of `width` floats).
        name: the member's unique name.
        eos_token_ids: ids that end a sequence (default: the tokenizer's EOS).
        width: the logits width (default: the tokenizer's length).
        context_window: tokens it can hold (0: no limit).
    """

    def __init__(
        self,
        tokenizer: Any,
        logits: LogitsFunction,
        name: str,
        *,
        eos_token_ids: Sequence[int] | None = None,
        width: int | None = None,
        context_window: int = 0,
        tail_tokens: int = DEFAULT_TAIL_TOKENS,
    ):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"`name` must be a non-empty string, but is {name!r}.")
        if eos_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            if eos is None:
                raise ConfigError("The tokenizer has no EOS token; give `eos_token_ids=`.")
            eos_token_ids = [eos]
        super().__init__(
            tokenizer,
            name,
            frozenset(int(i) for i in eos_token_ids),
            width or len(tokenizer),
            torch.device("cpu"),
            tail_tokens,
        )
        self._logits = logits
        self.context_window = context_window

    def _backend(self) -> Backend:
        return FunctionBackend(self._logits, self.logits_width)

    def _next_token_logprobs(self, ids: list[int]) -> torch.Tensor:
        backend = FunctionBackend(self._logits, self.logits_width)
        return torch.stack([torch.log_softmax(backend._call(ids[:t]), dim=-1)[ids[t]] for t in range(1, len(ids))])

    @classmethod
    def scripted(
        cls,
        tokenizer: Any,
        name: str,
        script: Callable[[str], Mapping[str, float]],
        **options: Any,
    ) -> FakeMember:
        """A member whose next-token probabilities are given per text seen so far.

        `script(text)` gets the decoded text of every id so far (prompt included) and returns
        {token text: probability}: each key must be the text of one token of this tokenizer
        (`"<eos>"` for its end token); every other token gets probability 0.
        """
        holder: dict[str, FakeMember] = {}

        def logits(ids: list[int]) -> torch.Tensor:
            member = holder["member"]
            text = member.table.spell(ids).decode("utf-8", errors="replace")
            values = torch.full((member.logits_width,), -math.inf)
            for piece, prob in script(text).items():
                values[member.token_for(piece)] = math.log(prob) if prob > 0 else -math.inf
            return values

        member = cls(tokenizer, logits, name, **options)
        holder["member"] = member
        return member

    def token_for(self, piece: str) -> int:
        """The id of the token whose text is exactly `piece` (`"<eos>"`: the end token)."""
        if piece == END:
            return self.end_token_id
        found = self.table.ids_by_bytes.get(piece.encode("utf-8"))
        if not found:
            raise ConfigError(f"{piece!r} is not one token of member {self.name!r}'s vocabulary.")
        return found[0]
