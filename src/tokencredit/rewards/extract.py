"""Answer extraction and light normalisation for math completions (pure string functions).

Extraction order (docs/spec/evaluation.md#answer-extraction), after markdown bold is stripped:

1. the last complete ``\\boxed{...}`` (braces balanced, escaped ``\\{`` / ``\\}`` ignored);
2. the last ``<answer>...</answer>`` span (the r1-zero template asks for it);
3. the last GSM8K-style ``#### 42`` line;
4. the last answer statement, as instruct models write them when no box was asked for or the
   model ignored the request: ``The final answer is: 21``, ``the answer is 21``, ``Answer: 21``,
   ``**Answer:** 21``, ``The answer to this problem is 21`` (`last_answer_statement`);
5. only when the task allows it, the last number.

Explicit delimiters (1-3) win over prose (4): a completion that boxes one answer and states another
is read by its box. Everything here is linear in the length of the text, so adversarial completions
(thousands of nested braces, megabytes of digits or of "answer is") cost only a scan; nothing is
ever evaluated.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
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
# An answer statement: the word "answer" (any case), then optionally "to <up to 80 characters of the
# same line>" ("The answer to this problem is"), then "is" / "would be" / "equals" / ":" / "=". The
# word is found from the end with str.rfind on an ASCII-lowercased copy (same length, so same
# positions); the tail's quantifiers are bounded or possessive, so each try costs O(80) at most.
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_STATEMENT_TAIL_RE = re.compile(
    r"(?:[ \t]++to\b[^\n]{0,80}?)?[ \t]*+(?:\b(?:is|would[ \t]++be|equals)\b|[:=])", re.IGNORECASE
)
# What ends the value of a statement: a sentence end, or a connective that starts an explanation.
_STATEMENT_END_RE = re.compile(
    r"[.!?](?=\s|$)|,?[ \t]++(?:which|because|since|so|but|therefore|thus|hence|where)\b", re.IGNORECASE
)
# A statement's value is read from at most this many characters after its verb; only the last
# _STATEMENT_SCAN occurrences of "answer" are looked at and the last _STATEMENT_TRIES statements
# tried (the last statement with a non-empty value wins): bounded work after one linear pass.
_STATEMENT_WINDOW = 1000
_STATEMENT_SCAN = 256
_STATEMENT_TRIES = 64
_WRAPPERS = (
    ("\\(", "\\)"),
    ("\\[", "\\]"),
    ("$", "$"),
    ("`", "`"),
    ("*", "*"),
    ("_", "_"),
    ('"', '"'),
    ("'", "'"),
)
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


def _statement_value(text: str, start: int) -> str | None:
    """The value a statement gives from `start` (just after its verb): the rest of the line, or the
    next non-blank line when the rest is blank ("The final answer is:\\n\\n21"), cut at the end of
    the sentence or at a connective (", which ..."), unwrapped from markdown / ``$`` / quotes; the
    result of ``a = 21`` when that is a plain number ("The answer is 9 + 12 = 21")."""
    window = text[start : start + _STATEMENT_WINDOW]
    lines = window.lstrip(" \t:").split("\n", 3)
    value = lines[0].strip()
    if not value:  # the value on the next non-blank line (at most two lines further)
        value = next((ln.strip() for ln in lines[1:3] if ln.strip()), "")
    m = _STATEMENT_END_RE.search(value)
    if m:
        value = value[: m.start()]
    value = value.strip().lstrip(":").strip()
    if _BOXED_RE.search(value):  # an unclosed box (a truncated answer) is not a statement
        return None
    changed = True
    while changed and value:
        changed = False
        for left, right in _WRAPPERS:
            if len(value) > len(left) + len(right) - 1 and value.startswith(left) and value.endswith(right):
                value, changed = value[len(left) : len(value) - len(right)].strip(), True
        if value[:1] in "*_" or value[-1:] in "*_":
            value, changed = value.strip("*_").strip(), True
    if value.count("=") == 1 and not re.search(r"[<>!=]=|=[=<>]", value):
        rhs = value.split("=")[1].strip()
        if canonical_number(rhs) is not None:
            value = rhs
    return _clean(value) if value else None


def last_answer_statement(text: str) -> str | None:
    """The value of the last answer statement ("The final answer is: 21", "Answer: 21", "the answer
    to 4 + 5 is 9"), or None. A statement with nothing after it (a truncated "The final answer is")
    is skipped in favour of the one before. Linear: one backward search for the word "answer", then a
    bounded look after each of the last ones."""
    tries = 0
    for pos in _answer_words(text):
        m = _STATEMENT_TAIL_RE.match(text, pos)
        if m is None:
            continue
        value = _statement_value(text, m.end())
        tries += 1
        if value is not None or tries >= _STATEMENT_TRIES:
            return value
    return None


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _answer_words(text: str) -> Iterator[int]:
    """End positions of the whole word "answer" (any ASCII case), the last first, among the last
    `_STATEMENT_SCAN` occurrences of the letters."""
    low = text.translate(_ASCII_LOWER)
    pos = len(low)
    for _ in range(_STATEMENT_SCAN):
        pos = low.rfind("answer", 0, pos)
        if pos < 0:
            return
        end = pos + 6
        if (pos == 0 or not _is_word_char(low[pos - 1])) and (end == len(low) or not _is_word_char(low[end])):
            yield end


def _clean(answer: str) -> str | None:
    a = strip_bold(answer).strip()
    # "$...$" around an extracted answer, and a full stop ending a sentence.
    a = a.strip("$").strip()
    if a.endswith(".") and not a.endswith("..."):
        a = a[:-1].rstrip()
    return a or None


def extract_answer(text: str, *, allow_last_number: bool = False) -> str | None:
    """The final answer of a completion as a string, or None when there is none.

    Order: last ``\\boxed{}``; last ``<answer>...</answer>``; last ``#### x`` line; last answer
    statement ("The final answer is: 21"); last number (only with ``allow_last_number``). Markdown
    bold is stripped first.
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
    stated = last_answer_statement(text)
    # On a task whose answers are numbers (allow_last_number), a statement without a digit ("the
    # answer is to add them") gives way to the last number, when there is one.
    if stated is not None and not (allow_last_number and not any(c.isdigit() for c in stated)):
        return stated
    if allow_last_number:
        nums = _NUMBER_RE.findall(text)
        if nums:
            return _clean(nums[-1].rstrip(","))
    return stated


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
