"""Answer extraction and light normalisation for math completions (pure string functions).

Extraction order (docs/spec/evaluation.md#answer-extraction): the last complete ``\\boxed{...}`` (braces balanced, escaped
``\\{`` / ``\\}`` ignored), then the last ``<answer>...</answer>`` span (the r1-zero template asks
for it), then a GSM8K-style ``#### 42`` line, then, only when the task allows it, the last number.
Everything here is linear in the length of the text, so adversarial completions (thousands of
nested braces, megabytes of digits) cost only a scan; nothing is ever evaluated.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\b")
_BOLD_RE = re.compile(r"\*\*([^*\n]+?)\*\*")
# Possessive [ \t]*+ and a greedy (.*\S): linear. The former "(.+?)[ \t]*$" rescanned the trailing
# blanks for every extra character, quadratic on a line of spaces (5 s for 20k of them).
_GSM8K_RE = re.compile(r"^[ \t]*+####[ \t]*+(.*\S)", re.MULTILINE)
_BOXED_TOKEN_RE = re.compile(r"[^\s$]+")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_THOUSANDS_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_PLAIN_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
# LaTeX spacing / sizing commands that never change an answer's value.
_SPACING_RE = re.compile(r"\\(?:left|right|displaystyle|textstyle)\b|\\[!,;: ]|~")
# A number this long is never canonicalised through Decimal (its value would be meaningless anyway).
_MAX_NUMBER_CHARS = 64


def strip_bold(text: str) -> str:
    """Remove markdown bold markers: ``**73**`` -> ``73`` (math-verify misreads them)."""
    return _BOLD_RE.sub(r"\1", text)


def _brace_matches(text: str) -> dict[int, int]:
    """Map the index of each '{' to the index of its matching '}' in one linear pass.

    A backslash escapes the next character, so ``\\{`` and ``\\}`` (LaTeX set braces) do not count.
    """
    matches: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            matches[stack.pop()] = i
        i += 1
    return matches


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``), else None.

    A trailing unclosed ``\\boxed{`` (a truncated answer) is skipped in favour of the last closed one.
    """
    starts = [m.end() for m in _BOXED_RE.finditer(text)]
    if not starts:
        return None
    matches: dict[int, int] | None = None
    for pos in reversed(starts):
        j = pos
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            if matches is None:
                matches = _brace_matches(text)
            end = matches.get(j)
            if end is not None:
                return text[j + 1 : end]
        elif j > pos:
            # "\boxed 5": the token after the space, up to whitespace or a closing "$".
            m = _BOXED_TOKEN_RE.match(text, j)  # from position j: no copy of the rest of the text
            if m:
                return m.group(0)
    return None


def last_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` span, as ``re.findall(r"<answer>(.*?)</answer>",
    text, re.DOTALL)[-1]`` would give it, but linear: that regex rescans the rest of the text from
    every unclosed ``<answer>`` (about a minute for 20k of them)."""
    last, pos = None, 0
    while True:
        start = text.find("<answer>", pos)
        if start < 0:
            return last
        end = text.find("</answer>", start + 8)
        if end < 0:
            return last
        last, pos = text[start + 8 : end], end + 9


def _clean(answer: str) -> str | None:
    a = strip_bold(answer).strip()
    # "$...$" around an extracted answer, and a full stop ending a sentence.
    a = a.strip("$").strip()
    if a.endswith(".") and not a.endswith("..."):
        a = a[:-1].rstrip()
    return a or None


def extract_answer(text: str, *, allow_last_number: bool = False) -> str | None:
    """The final answer of a completion as a string, or None when there is none.

    Order: last ``\\boxed{}``; last ``<answer>...</answer>``; last ``#### x`` line; last number
    (only with ``allow_last_number``). Markdown bold is stripped first.
    """
    if not isinstance(text, str):
        raise TypeError(f"completion must be a str, got {type(text).__name__}")
    text = strip_bold(text)
    boxed = last_boxed(text)
    if boxed is not None:
        return _clean(boxed)
    tag = last_answer_tag(text)
    if tag is not None:
        return _clean(tag)
    hashes = _GSM8K_RE.findall(text)
    if hashes:
        return _clean(hashes[-1])
    if allow_last_number:
        nums = _NUMBER_RE.findall(text)
        if nums:
            return _clean(nums[-1].rstrip(","))
    return None


def canonical_number(s: str) -> str | None:
    """``"142.0"`` -> ``"142"``, ``"0.50"`` -> ``"0.5"``, ``"1,000"`` -> ``"1000"``; None if not a plain number."""
    t = s.strip()
    if _THOUSANDS_RE.fullmatch(t):
        t = t.replace(",", "")
    if len(t) > _MAX_NUMBER_CHARS or not _PLAIN_NUMBER_RE.fullmatch(t):
        return None
    try:
        d = Decimal(t)
    except InvalidOperation:
        return None
    if d == 0:
        return "0"
    out = format(d.normalize(), "f")
    return out


def clean_for_verifier(answer: str) -> str:
    """Light, value-preserving clean-up of a gold or extracted answer before math-verify sees it.

    Removes spacing commands (``\\!``, ``\\left``...), a leading escaped dollar sign, and thousands
    separators; canonicalises plain numbers (``142.0`` -> ``142``, the float-gold case).
    """
    a = _SPACING_RE.sub(" ", strip_bold(answer)).strip()
    a = re.sub(r"^\\\$\s*", "", a).strip()
    compact = re.sub(r"\s+", "", a)
    num = canonical_number(compact)
    if num is not None:
        return num
    return a


def normalize_answer(answer: str) -> str:
    """A conservative canonical string: equal outputs mean equal answers (used for the verifier's
    fast path, cache keys and majority voting). Different outputs may still be equivalent.
    """
    a = clean_for_verifier(answer)
    a = re.sub(r"\\[dt]frac\b", r"\\frac", a)
    # Whitespace is dropped except between two letters, where it separates a command from a
    # variable ("\pi r" must not become "\pir").
    a = re.sub(r"(?<![A-Za-z])\s+|\s+(?![A-Za-z])", "", a)
    a = re.sub(r"\s+", " ", a)
    return a
