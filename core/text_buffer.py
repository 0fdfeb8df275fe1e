"""One prompt's committed text: stop strings matched on bytes, and safe streaming."""

from __future__ import annotations

from ensemble_core.vocab.utf8 import incomplete_utf8_suffix


class TextBuffer:
    """Committed bytes of one prompt, with stop-string detection and streaming hold-back.

    A stop string can span any number of commits (it is searched from where it could have
    begun). While streaming, bytes that could still turn into a stop string, and an
    incomplete UTF-8 character, are held back, so nothing shown is ever taken back.
    """

    def __init__(self, stop: tuple[str, ...] = ()):
        self._stops = [s.encode("utf-8") for s in stop]
        self._longest = max((len(s) for s in self._stops), default=0)
        self.data = bytearray()
        self._shown = 0

    def append(self, chunk: bytes) -> bool:
        """Add committed bytes; True when a stop string appeared (the text is cut before it)."""
        search_from = max(0, len(self.data) - self._longest + 1)
        self.data += chunk
        hits = [found for stop in self._stops if (found := self.data.find(stop, search_from)) >= 0]
        if not hits:
            return False
        del self.data[min(hits) :]
        return True

    def tail(self, size: int) -> bytes:
        """The last `size` committed bytes (fewer if there are fewer)."""
        return bytes(self.data[-size:]) if size > 0 else b""

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", errors="replace")

    def take_new_text(self, final: bool) -> str:
        """Text not shown yet that can no longer change; everything when `final`."""
        end = len(self.data)
        if not final:
            end -= self._possible_stop_start(end)
            end -= incomplete_utf8_suffix(bytes(self.data[self._shown : end]))
        if end <= self._shown:
            return ""
        piece = bytes(self.data[self._shown : end])
        self._shown = end
        return piece.decode("utf-8", errors="replace")

    def _possible_stop_start(self, end: int) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        for size in range(min(self._longest - 1, end - self._shown), 0, -1):
            tail = bytes(self.data[end - size : end])
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0
