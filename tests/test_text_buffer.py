"""Stop strings on committed bytes, and streaming that never shows what it must take back."""

from __future__ import annotations

from ensemble_core.text_buffer import TextBuffer


def feed(buffer: TextBuffer, chunks: list[bytes]) -> tuple[list[str], bool]:
    shown, stopped = [], False
    for chunk in chunks:
        stopped = buffer.append(chunk)
        shown.append(buffer.take_new_text(final=stopped))
        if stopped:
            break
    return shown, stopped


def test_stop_string_split_across_commits_is_found_and_cut() -> None:
    buffer = TextBuffer(("\n\nQ:",))
    shown, stopped = feed(buffer, [b"Answer", b" 42\n", b"\nQ", b": next"])
    assert stopped
    assert buffer.text() == "Answer 42"
    assert "".join(shown) == "Answer 42"
    assert all("\n" not in piece for piece in shown)  # the held-back "\n" was never shown


def test_stop_string_inside_one_commit() -> None:
    buffer = TextBuffer(("END", "x"))
    assert buffer.append(b"abcENDdef")
    assert buffer.text() == "abc"


def test_earliest_of_several_stop_strings_wins() -> None:
    buffer = TextBuffer(("cd", "bcde"))
    assert buffer.append(b"abcdef")
    assert buffer.text() == "a"  # "bcde" starts first, though "cd" ends first


def test_split_utf8_characters_are_held_back_while_streaming() -> None:
    buffer = TextBuffer()
    data = "你好🙂".encode()
    pieces = []
    for i in range(len(data)):
        buffer.append(data[i : i + 1])
        pieces.append(buffer.take_new_text(final=False))
    pieces.append(buffer.take_new_text(final=True))
    assert "".join(pieces) == "你好🙂"
    assert all("\ufffd" not in p for p in pieces)


def test_text_that_only_might_become_a_stop_is_released_when_it_cannot() -> None:
    buffer = TextBuffer(("STOP",))
    buffer.append(b"ST")
    assert buffer.take_new_text(final=False) == ""
    buffer.append(b"AY")
    assert buffer.take_new_text(final=False) == "STAY"
