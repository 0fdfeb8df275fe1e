"""Token ids as bytes, and the union vocabulary of several members.

`token_bytes(tokenizer)` (the public helper), `token_table` / `TokenTable` (bytes and kinds per
id), `build_union` / `UnionVocab` (the members' union), `incomplete_utf8_suffix`.
"""

from ensemble_core.vocab.tokens import Scheme, TokenKind, TokenTable, token_bytes, token_table
from ensemble_core.vocab.union import EOS_INDEX, MemberMap, UnionVocab, build_union
from ensemble_core.vocab.utf8 import incomplete_utf8_suffix

__all__ = [
    "EOS_INDEX",
    "MemberMap",
    "Scheme",
    "TokenKind",
    "TokenTable",
    "UnionVocab",
    "build_union",
    "incomplete_utf8_suffix",
    "token_bytes",
    "token_table",
]
