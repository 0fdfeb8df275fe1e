"""UTF-8 facts the byte-level bookkeeping needs (committed text may end inside a character)."""

from __future__ import annotations


def incomplete_utf8_suffix(data: bytes) -> int:
    """How many trailing bytes form the start of a UTF-8 character that is not yet complete.

    Only a valid lead byte followed by too few continuation bytes counts; bytes that can
    never become valid UTF-8 are not held back (they are passed on as byte tokens).
    """
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return back if needed > back else 0
    return 0
