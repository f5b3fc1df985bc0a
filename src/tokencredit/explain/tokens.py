"""How a token's text is shown on the page and in the picture: byte tokens as ``<0xNN>``, control
characters as named symbols.

A token that is only part of a UTF-8 character decodes to U+FFFD ("�"), which says nothing about
which byte it is. SentencePiece's byte-fallback pieces (``<0x0A>``, Llama, Mistral, Gemma) are shown
as that piece; a byte-level BPE token (GPT-2, Qwen, Llama 3, SmolLM2) whose bytes do not form whole
characters has them shown as ``<0xNN>`` each, its whole characters as text. Such a token is flagged
(`display_text`'s second value) so that the page draws each ``<0xNN>`` in the ``byte`` style, never
confused with the same characters typed as text. A real U+FFFD (a whole character) stays "�".

Control characters (Unicode category Cc: tab, newline, carriage return, escape, ...) are drawn as
symbols in their own style (`control_symbol`), so that a tab never reads as a literal arrow.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import cache
from typing import Any

__all__ = ["BYTE_MARK", "control_symbol", "display_text", "is_control", "saved_display_text"]

# a shown byte: what a byte-fallback piece is called, and how bytes outside whole characters are written
BYTE_MARK = re.compile(r"<0x([0-9A-F]{2})>")
_FALLBACK_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_NAMED = {"\t": ("⇥", "tab"), "\n": ("↵", "newline"), "\r": ("␍", "carriage return"), "\x7f": ("␡", "delete")}
# unicodedata has no name for control characters: the common ones', for the tooltip
_C0_NAMES = {0x00: "null", 0x08: "backspace", 0x0B: "vertical tab", 0x0C: "form feed", 0x1B: "escape"}


def is_control(ch: str) -> bool:
    """Whether `ch` is a control character (Unicode category Cc: C0, DEL and C1)."""
    return unicodedata.category(ch) == "Cc"


def control_symbol(ch: str) -> tuple[str, str]:
    """(symbol drawn, name for a tooltip) of the control character `ch`: ⇥ tab, ↵ newline, the Control
    Pictures block for the other C0 characters (␛ escape), the code point for C1 (U+0085 for next line)."""
    symbol, name = _NAMED.get(ch, ("", ""))
    code = f"U+{ord(ch):04X}"
    if not symbol:
        symbol = chr(0x2400 + ord(ch)) if ord(ch) < 0x20 else code
        name = _C0_NAMES.get(ord(ch), "control character")
    return symbol, f"{name} ({code})"


@cache
def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-ins for the 256 bytes (char -> byte): printable Latin-1 bytes are
    their own character, the other bytes take U+0100 onwards in byte order (the scheme GPT-2 published)."""
    own = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    owned = set(own)
    alphabet = {chr(b): b for b in own}
    others = (b for b in range(256) if b not in owned)
    alphabet.update({chr(0x100 + k): b for k, b in enumerate(others)})
    return alphabet


def _marked(data: bytes) -> str:
    """`data` decoded as UTF-8, each byte that is not part of a whole character written as <0xNN>."""
    out: list[str] = []
    while data:
        try:
            out.append(data.decode("utf-8"))
            break
        except UnicodeDecodeError as e:
            out.append(data[: e.start].decode("utf-8"))
            out.extend(f"<0x{b:02X}>" for b in data[e.start : e.end])
            data = data[e.end :]
    return "".join(out)


def _byte_level(tokenizer: Any) -> bool:
    """Whether `tokenizer` decodes with byte-level BPE (its pieces are bytes in `_byte_alphabet`)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return "ByteLevel" in str(getattr(backend, "decoder", ""))


def display_text(tokenizer: Any, ids: Sequence[int]) -> tuple[list[str], list[bool]]:
    """(text shown, holds <0xNN> byte marks?) of each token id, decoded one id at a time (module docstring)."""
    byte_level = _byte_level(tokenizer)
    alphabet = _byte_alphabet()
    pieces = tokenizer.convert_ids_to_tokens(list(ids))
    texts, marked = [], []
    for i, piece in zip(ids, pieces):
        fallback = _FALLBACK_PIECE.fullmatch(piece) if isinstance(piece, str) else None
        if fallback is not None:
            texts.append(f"<0x{fallback.group(1).upper()}>")
            marked.append(True)
            continue
        text = tokenizer.decode([i], skip_special_tokens=False)
        cut = False
        # the replacement character from a cut UTF-8 sequence, not one the model wrote as a whole character
        if "\ufffd" in text and byte_level and piece and all(ch in alphabet for ch in piece):
            text = _marked(bytes(alphabet[ch] for ch in piece))
            cut = BYTE_MARK.search(text) is not None
        texts.append(text)
        marked.append(cut)
    return texts, marked


def saved_display_text(tokens: Sequence[str]) -> tuple[list[str], list[bool]]:
    """(text shown, byte piece?) of raw token strings saved without a tokenizer at hand: byte-fallback pieces as
    <0xNN>, byte-level and SentencePiece markers for space and newline (Ġ Ċ ▁) as those characters."""
    texts, marked = [], []
    for t in tokens:
        fallback = _FALLBACK_PIECE.fullmatch(t)
        if fallback is not None:
            texts.append(f"<0x{fallback.group(1).upper()}>")
            marked.append(True)
        else:
            texts.append(t.replace("Ġ", " ").replace("Ċ", "\n").replace("▁", " "))
            marked.append(False)
    return texts, marked
