"""What explain shows by default (groups with non-zero credit, those whose rewards differ first, on the page and in
--png) and how a token's text is drawn: byte tokens as <0xNN>, control characters apart from literal text."""

from __future__ import annotations

import json

import pytest
from test_explain import Page
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tokencredit import cli
from tokencredit.explain import load_jsonl
from tokencredit.explain.picture import _visible
from tokencredit.explain.render import _token_html
from tokencredit.explain.selection import credited_selection, select_groups
from tokencredit.explain.tokens import control_symbol, display_text, saved_display_text


# ------------------------------------------------------------------------------------------ byte tokens
def _byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (GPT-2 / Qwen style) whose vocabulary is the 256 byte symbols plus "é" as one token: "你"
    (3 UTF-8 bytes) is three tokens, none of them a whole character."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab["Ã©"] = len(vocab)  # "é" = bytes C3 A9, as byte-level symbols
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ã", "©")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE with byte fallback (Llama, Mistral): a character outside the vocabulary is its
    UTF-8 bytes as <0xNN> pieces."""
    vocab = {"<unk>": 0, "▁": 1, "a": 2, "b": 3, **{f"<0x{b:02X}>": 4 + b for b in range(256)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_byte_level_tokens_that_cut_a_character_are_shown_as_bytes():
    tok = _byte_level_tokenizer()
    ids = tok("a你é\ufffd", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in ids][1:4] == ["\ufffd"] * 3  # what the page showed before
    texts, marked = display_text(tok, ids)
    assert texts[:5] == ["a", "<0xE4>", "<0xBD>", "<0xA0>", "é"]
    assert marked[:5] == [False, True, True, True, False]
    # a real U+FFFD (EF BF BD, three tokens) is one character over three tokens: each a byte, not "�"
    assert "".join(texts[5:]) == "<0xEF><0xBF><0xBD>"


def test_byte_fallback_pieces_are_shown_as_their_byte():
    tok = _byte_fallback_tokenizer()
    ids = [2, 4 + 0x0A, 4 + 0xE4, 4 + 0xBD, 4 + 0xA0, 3]
    texts, marked = display_text(tok, ids)
    assert texts == ["a", "<0x0A>", "<0xE4>", "<0xBD>", "<0xA0>", "b"]
    assert marked == [False, True, True, True, True, False]
    # without a tokenizer, from the raw pieces a run saved
    assert saved_display_text(["▁a", "<0x0a>", "Ġb", "Ċ"]) == (
        [" a", "<0x0A>", " b", "\n"],
        [False, True, False, False],
    )


def test_bytes_and_control_characters_are_styled_apart_from_literal_text():
    assert _token_html("<0xE4>", byte_marks=True) == (
        '<i class="byte" title="byte 0xE4, part of a UTF-8 character">&lt;0xE4&gt;</i>'
    )
    assert _token_html("<0x0A>", byte_marks=True).endswith("</i><br>")  # a newline byte still breaks the line
    assert _token_html("<0xE4>") == "&lt;0xE4&gt;"  # the same characters typed as text: plain
    assert _token_html("a\tb") == 'a<i class="ctl" title="tab (U+0009)">⇥</i>b'
    assert _token_html("→") == "→"  # a literal arrow is text, a tab is not drawn as one
    assert _token_html("\n") == '<i class="ctl" title="newline (U+000A)">↵</i><br>'
    assert control_symbol("\x1b") == ("␛", "escape (U+001B)")
    assert control_symbol("\x85")[0] == "U+0085"
    # the picture: the same symbols, the token drawn in the marked style
    assert _visible("\t", False) == ("⇥", True)
    assert _visible("→", False) == ("→", False)
    assert _visible("<0xE4>", True) == ("<0xE4>", True)


# ------------------------------------------------------------------------------------------ which groups by default
def _file(tmp_path, rewards: list[list[float]]):
    f = tmp_path / "in.jsonl"
    lines = [
        {"problem": f"What is {k} + 30?", "completions": [f"{k + 30}", f"{k + 31}"][: len(r)], "rewards": r}
        for k, r in enumerate(rewards)
    ]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return f


def test_the_default_choice_is_the_groups_with_credit_those_whose_rewards_differ_first(tmp_path):
    groups = load_jsonl(_file(tmp_path, [[0, 0], [0, 0], [1, 0], [1, 1], [0, 0.5]]))
    cand = select_groups(groups, kind="credit", count=2)
    assert cand.by_credit and [g.group_id for g in cand.groups] == [2, 4]  # checked before the model loads
    chosen = credited_selection(groups, {0, 2, 4}, count=3)
    assert [g.group_id for g in chosen.groups] == [2, 4, 0] and not chosen.by_credit
    assert "where some method's credit is non-zero" in chosen.description
    none = credited_selection(groups, set(), count=2)
    assert [g.group_id for g in none.groups] == [0, 1] and "no method gives any group" in none.description
    assert [g.group_id for g in select_groups(groups, count=2).groups] == [0, 1]  # --select any: file order


def test_explain_opens_on_credit_and_its_png_is_not_blank(tmp_path, tiny_model_dir):
    from PIL import Image

    f = _file(tmp_path, [[0, 0], [0, 0], [0, 0], [1, 0]])  # a real run's first groups all wrong
    out, png = tmp_path / "r.html", tmp_path / "r.png"
    argv = ["explain", "--jsonl", f, "--model", tiny_model_dir, "--methods", "ktae,uniform", "--out", out]
    assert cli.main([*map(str, argv), "--png", str(png)]) == 0
    page = Page(out.read_text())
    assert {r["group"] for r in page.data["rows"].values()} == {3}  # the only group with non-zero credit
    pixels = Image.open(png).convert("RGB").get_flattened_data()
    assert any(r > 150 and g < 120 and b < 120 for r, g, b in pixels)  # red: negative credit
    assert any(b > 150 and r < 120 for r, g, b in pixels)  # blue: positive credit
    # the explicit options as before: --select any shows the first groups, --group-index those named
    assert cli.main([*map(str, argv), "--select", "any", "--groups", "2"]) == 0
    assert {r["group"] for r in Page(out.read_text()).data["rows"].values()} == {0, 1}
    assert cli.main([*map(str, argv), "--group-index", "1"]) == 0
    assert {r["group"] for r in Page(out.read_text()).data["rows"].values()} == {1}


@pytest.mark.parametrize("rewards", [[[0, 0], [1, 1]]])
def test_with_no_credit_anywhere_the_first_groups_are_shown_and_said(tmp_path, tiny_model_dir, rewards):
    out = tmp_path / "r.html"
    argv = [
        "explain",
        "--jsonl",
        _file(tmp_path, rewards),
        "--model",
        tiny_model_dir,
        "--methods",
        "ktae,uniform",
    ]
    assert cli.main([*map(str, argv), "--out", str(out)]) == 0
    assert "no method gives any group non-zero credit" in out.read_text()
    assert {r["group"] for r in Page(out.read_text()).data["rows"].values()} == {0, 1}
