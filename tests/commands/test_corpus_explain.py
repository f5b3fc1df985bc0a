"""The bad-input corpus of `tokencredit explain` (issue 39, items 2, 3 and the explain parts of 5): each case
runs the real CLI entry point and must end within seconds, either with exit code 2 and one line on stderr
naming the input (file:line and the field, the option, the path) and no page or picture written (no
half-written file, no temporary file left beside it), or, for what is accepted, with the page written and
what was done said: a completion cut to the model's positions (a stderr line and a page note), a page past
a browser's comfort (a warning with its estimated size), maths and special-token text shown literally,
bidirectional controls made visible.

The model is the session's tiny toy model (`tiny_model_dir`: character-level tokenizer of 99 tokens, 512
positions); the checks that guard the model's work are shown to run before it (`no_model_load`)."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from bad_input import one_line_error
from tokencredit import cli

SECONDS = 30  # generous: every case stops before any real work, and the tiny model scores in a second

OK_LINE = {"problem": "What is 1+1?", "completions": ["2", "3"], "rewards": [1.0, 0.0]}


def _jsonl(path: Path, *lines: dict | str | bytes) -> Path:
    """A JSONL file of `lines` (objects as JSON; strings and bytes as they are, one per line)."""
    data = b""
    for x in lines:
        raw = x if isinstance(x, bytes) else (x if isinstance(x, str) else json.dumps(x)).encode("utf-8")
        data += raw + b"\n"
    path.write_bytes(data)
    return path


def _listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], names: list[str], folder: Path) -> str:
    """`tokencredit explain ARGV`: exit 2 and one line naming `names`, within `SECONDS`, and nothing new in
    `folder` (where the page and the picture would go)."""
    before = _listing(folder)
    t0 = time.perf_counter()
    line = one_line_error(["explain", *map(str, argv)], capsys, names=names)
    assert time.perf_counter() - t0 < SECONDS, line
    assert _listing(folder) == before, line  # no page, no picture, no temporary file
    return line


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model's weights fails the test: what it guards must have been refused before."""
    from tokencredit.explain import signals

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(signals, "load_model", refuse)


def _page_blob(html: str) -> dict:
    return json.loads(html.split('id="tc-data">', 1)[1].split("</script>", 1)[0])


def _notes(html: str) -> list[str]:
    return re.findall(r"<li>(.*?)</li>", html.split('<ul class="notes">', 1)[1].split("</ul>", 1)[0])


# ---- a JSONL of rollouts: each bad line names file:line and the field --------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
JSONL_CASES = [
    # (id, the file's lines, what the error line must name besides file:line)
    (
        "token-id-outside-vocab",
        [{"prompt": "P", "completions": [{"token_ids": [5, 100000], "score": 1.0}]}],
        ["completions[0].token_ids[1] = 100000", "outside the vocabulary", "ids 0 to 98"],
    ),
    (
        "token-id-1e30",
        [{"prompt": "P", "completions": [{"token_ids": [5, 10**30], "score": 1.0}]}],
        ["completions[0].token_ids[1] = 1000000000000000000000000000000", "not a token id"],
    ),
    (
        "token-id-bool",
        [{"prompt": "P", "completions": [{"token_ids": [True, 5], "score": 1.0}]}],
        ["completions[0].token_ids[0] = True"],
    ),
    (
        "group-id-1e30",
        [{"group": 10**30, "prompt": "P", "completions": ["a"], "rewards": [1.0]}],
        ["'group' = 1000000000000000000000000000000", "64 bits"],
    ),
    (
        "lone-surrogate-prompt",
        ['{"prompt": "P\\ud800", "completions": ["a"], "rewards": [1]}'],
        ["'prompt'", "lone surrogate", "'\\ud800'"],
    ),
    (
        "lone-surrogate-completion",
        ['{"problem": "1+1?", "completions": ["a", "b\\udfff"], "rewards": [1, 0]}'],
        ["completions[1]", "lone surrogate"],
    ),
    (
        "lone-surrogate-token",
        ['{"prompt": "P", "completions": [{"token_ids": [5], "tokens": ["\\ud800"], "score": 1}]}'],
        ["completions[0].tokens[0]", "lone surrogate"],
    ),
    (
        "reward-1e308",
        [{"prompt": "P", "completions": ["a", "b"], "rewards": [1e308, 0.0]}],
        ["rewards[0] = 1e+308", "not in float32"],
    ),
    (
        "reward-minus-1e308",
        [{"prompt": "P", "completions": ["a", "b"], "rewards": [0.0, -1e308]}],
        ["rewards[1] = -1e+308", "not in float32"],
    ),
    (
        "score-1e39",
        [{"prompt": "P", "completions": [{"token_ids": [5], "score": 1e39}]}],
        ["completions[0].score = 1e+39", "not in float32"],
    ),
    ("reward-nan", ['{"prompt": "P", "completions": ["a"], "rewards": [NaN]}'], ["rewards[0]", "finite"]),
    (
        "reward-5000-digits",
        ['{"prompt": "P", "completions": ["a"], "rewards": [' + "9" * 5000 + "]}"],
        ["unreadable JSON line", "4300 digits"],
    ),
    (
        "saved-advantage-nan",
        [
            '{"prompt": "P", "completions": [{"token_ids": [5, 6], "score": 1, "token_advantages": [0.5, NaN]}]}'
        ],
        ["completions[0].token_advantages[1]", "finite"],
    ),
    ("nested-too-deep", [OK_LINE, DEEP], ["JSON nested too deeply"]),
    (
        "latin-1",
        [OK_LINE, '{"prompt": "café", "completions": ["a"], "rewards": [1]}'.encode("latin-1")],
        ["not UTF-8 text", "byte 0xe9", "iconv"],
    ),
    ("binary", [bytes(range(256))], ["NUL byte", "binary file"]),
    (
        "group-of-size-0",
        [{"prompt": "P", "completions": [], "rewards": []}],
        ["'completions' must be a non-empty list"],
    ),
    (
        "prompt-past-positions",
        [{"prompt": "x" * 600, "completions": ["a"], "rewards": [1.0]}],
        ["the prompt has 600 tokens", "512 positions"],
    ),
]
# the line of the file the error must name (the bad line is the last one)
JSONL_LINE = {"nested-too-deep": 2, "latin-1": 2}


@pytest.mark.parametrize("lines, names", [c[1:] for c in JSONL_CASES], ids=[c[0] for c in JSONL_CASES])
def test_jsonl_bad_lines(request, lines, names, tiny_model_dir, tmp_path, capsys, no_model_load):
    f = _jsonl(tmp_path / "in.jsonl", *lines)
    line_no = JSONL_LINE.get(request.node.callspec.id, 1)
    argv = [
        "--jsonl",
        f,
        "--model",
        tiny_model_dir,
        "--methods",
        "ktae,uniform",
        "--out",
        tmp_path / "p.html",
        "--png",
        tmp_path / "p.png",
    ]
    _refused(argv, capsys, [f"{f}:{line_no}: ", *names], tmp_path)


def test_empty_jsonl_and_a_directory_given_as_jsonl(tiny_model_dir, tmp_path, capsys, no_model_load):
    f = _jsonl(tmp_path / "empty.jsonl")
    out = ["--model", tiny_model_dir, "--out", tmp_path / "p.html"]
    _refused(["--jsonl", f, *out], capsys, [str(f), "no group in the file"], tmp_path)
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    _refused(
        ["--jsonl", tmp_path / "blank.jsonl", *out], capsys, ["blank.jsonl", "no group in the file"], tmp_path
    )
    (tmp_path / "d").mkdir()
    _refused(
        ["--jsonl", tmp_path / "d", *out], capsys, ["--jsonl", str(tmp_path / "d"), "a directory"], tmp_path
    )
    _refused(["--jsonl", "/dev/zero", *out], capsys, ["--jsonl /dev/zero: not a regular file"], tmp_path)


# ---- options: each names the option ----------------------------------------------------------------------

OPTION_CASES = [
    (["--temperature", "0"], ["--temperature", "got 0.0"]),
    (["--temperature", "nan"], ["--temperature", "got nan"]),
    (["--temperature", "-1"], ["--temperature", "got -1.0"]),
    (["--temperature", "inf"], ["--temperature", "got inf"]),
    (["--groups", "-3"], ["--groups must be >= 1, got -3"]),
    (["--groups", "0"], ["--groups must be >= 1, got 0"]),
    (["--max-tokens", "0"], ["--max-tokens must be >= 1"]),
    (["--batch-size", "0"], ["--batch-size must be >= 1"]),
    (["--methods", "ktae,nope"], ["--methods", "'nope'"]),
    (["--methods", "ktea"], ["closest: ktae"]),
    (["--select", "mixd"], ["--select", "closest: mixed"]),
    (["--group-index", "5"], ["--group-index 5", "there are 1 groups"]),
    (["--template", "bogus"], ["--template", "'bogus'"]),
    (["--advantage", "grop"], ["--advantage", "'grop'"]),
    (["--device", "tpu"], ["--device", "'tpu'"]),
    (["--step", "3"], ["--step"]),
]


@pytest.mark.parametrize("extra, names", OPTION_CASES, ids=[" ".join(c[0]) for c in OPTION_CASES])
def test_bad_options(extra, names, tiny_model_dir, tmp_path, capsys, no_model_load):
    f = _jsonl(tmp_path / "in.jsonl", OK_LINE)
    argv = ["--jsonl", f, "--model", tiny_model_dir, "--out", tmp_path / "p.html", *extra]
    _refused(argv, capsys, names, tmp_path)


# ---- where the page and the picture go: checked before any model loads ------------------------------------


def test_unwritable_outputs_are_refused_before_the_model(tiny_model_dir, tmp_path, capsys, no_model_load):
    f = _jsonl(tmp_path / "in.jsonl", OK_LINE)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("not a directory\n")
    base = ["--jsonl", f, "--model", tiny_model_dir]
    cases = [
        (["--out", tmp_path / "adir"], ["--out", str(tmp_path / "adir"), "is a directory"]),
        (
            ["--out", tmp_path / "afile" / "p.html"],
            ["--out", str(tmp_path / "afile" / "p.html"), "not a directory"],
        ),
        (
            ["--out", tmp_path / "p.html", "--png", tmp_path / "afile" / "deeper" / "p.png"],
            ["--png", str(tmp_path / "afile" / "deeper" / "p.png"), "not a directory"],
        ),
        (["--out", tmp_path / "p.html", "--png", tmp_path / "adir"], ["--png", "is a directory"]),
        (["--out", f], ["--out", str(f), "the input file"]),
        (
            ["--out", tmp_path / "p.html", "--png", tmp_path / "p.html"],
            ["--png", "the same file as the page"],
        ),
    ]
    for extra, names in cases:
        _refused([*base, *extra], capsys, names, tmp_path)
    assert (tmp_path / "afile").read_text() == "not a directory\n"


def test_a_read_only_directory_is_refused(tiny_model_dir, tmp_path, capsys, no_model_load, monkeypatch):
    """A directory that cannot be written (a read-only file system, a missing permission: os.access does not
    tell root) is found by writing a probe file there, before any model loads."""
    import tempfile

    f = _jsonl(tmp_path / "in.jsonl", OK_LINE)
    ro = tmp_path / "ro"
    ro.mkdir()
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        if Path(kwargs.get("dir", "")) == ro:
            raise OSError(30, "Read-only file system")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    argv = ["--jsonl", f, "--model", tiny_model_dir, "--out", ro / "sub" / "p.html"]
    _refused(argv, capsys, ["--out", str(ro / "sub" / "p.html"), "Read-only file system"], tmp_path)
    assert _listing(ro) == set()


def test_a_failed_write_leaves_no_half_written_page(tiny_model_dir, tmp_path, capsys, full_disk):
    """The disk fills up while the page is written: one line naming --out, no page and no temporary file."""
    f = _jsonl(tmp_path / "in.jsonl", OK_LINE)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    full_disk(out_dir, "p.html")
    before = _listing(out_dir)
    one_line_error(
        ["explain", "--jsonl", str(f), "--model", tiny_model_dir, "--out", str(out_dir / "p.html")],
        capsys,
        names=["--out", str(out_dir / "p.html"), "nothing was written"],
    )
    assert _listing(out_dir) == before


# ---- --model: one the user names must load; only the implicit RUN_DIR/final degrades to a note -------------


def _run_dir(root: Path, *, model: str | None = None, ids: list[int] | None = None) -> Path:
    """A run directory holding one saved step of two groups (token ids of the toy tokenizer), and with
    `model` a copy of it as final/."""
    run = root / "run"
    (run / "rollouts").mkdir(parents=True)
    lines = []
    for gid in range(2):
        comps = [
            {"text": "ab", "token_ids": ids or [69, 70], "score": float(k == gid), "correct": k == gid}
            for k in range(2)
        ]
        lines.append(json.dumps({"group": gid, "problem": f"Compute {gid} + 1.", "completions": comps}))
    (run / "rollouts" / "step_000001.jsonl").write_text("\n".join(lines) + "\n")
    if model is not None:
        shutil.copytree(model, run / "final")
    return run


def test_an_explicit_model_that_cannot_load_is_an_error(tiny_model_dir, tmp_path, capsys):
    run = _run_dir(tmp_path)
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    out = ["--methods", "ktae,delta,uniform", "--out", tmp_path / "p.html"]
    _refused([run, "--model", passwd, *out], capsys, ["--model", str(passwd)], tmp_path)
    _refused([run, "--model", tmp_path / "nope", *out], capsys, ["--model", str(tmp_path / "nope")], tmp_path)
    empty = tmp_path / "empty-model"
    empty.mkdir()
    _refused([run, "--model", empty, *out], capsys, ["--model", str(empty)], tmp_path)
    f = _jsonl(tmp_path / "in.jsonl", OK_LINE)
    _refused(["--jsonl", f, "--model", passwd, *out], capsys, ["--model", str(passwd)], tmp_path)
    # the implicit RUN_DIR/final (absent here) degrades to a note: the page is written, delta skipped
    capsys.readouterr()
    assert cli.main(["explain", str(run), *map(str, out)]) == 0
    page = (tmp_path / "p.html").read_text()
    assert "no tokenizer in" in page and "no model loaded" in page


def test_a_runs_token_id_outside_the_models_vocabulary(tiny_model_dir, tmp_path, capsys):
    run = _run_dir(tmp_path, model=tiny_model_dir, ids=[69, 4000])
    saved = run / "rollouts" / "step_000001.jsonl"
    argv = [run, "--methods", "uniform", "--out", tmp_path / "p.html"]
    _refused(
        argv,
        capsys,
        [f"{saved}:1: ", "completions[0].token_ids[1] = 4000", "outside the vocabulary"],
        tmp_path,
    )


def test_a_directory_without_saved_rollouts(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    line = _refused(
        [tmp_path / "run", "--out", tmp_path / "p.html"], capsys, [str(tmp_path / "run")], tmp_path
    )
    assert "no saved rollouts" in line


# ---- accepted, with what was done said --------------------------------------------------------------------


def test_a_200kb_completion_is_cut_to_the_models_positions_with_a_note(tiny_model_dir, tmp_path, capsys):
    f = _jsonl(
        tmp_path / "in.jsonl",
        {"problem": "What is 1+1?", "completions": ["2" * 200_000, "3"], "rewards": [1.0, 0.0]},
    )
    out = tmp_path / "p.html"
    t0 = time.perf_counter()
    assert (
        cli.main(
            [
                "explain",
                "--jsonl",
                str(f),
                "--model",
                tiny_model_dir,
                "--methods",
                "ktae,delta,uniform",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert time.perf_counter() - t0 < SECONDS
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and f"{f}:1 completions[0]: 200000 -> " in err[0] and "512 positions" in err[0], err
    kept = int(re.search(r"200000 -> (\d+) tokens", err[0]).group(1))
    html = out.read_text()
    blob = _page_blob(html)
    assert len(blob["rows"]["0"]["tokens"]) == kept and 0 < kept < 512
    assert any("200000 -&gt; " in n and "marked truncated" in n for n in _notes(html))
    assert 'class="k">truncated</span>' in html
    # --max-tokens cuts lower still, and says so
    assert (
        cli.main(
            [
                "explain",
                "--jsonl",
                str(f),
                "--model",
                tiny_model_dir,
                "--methods",
                "uniform",
                "--max-tokens",
                "7",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "200000 -> 7 tokens, --max-tokens 7" in err
    assert len(_page_blob(out.read_text())["rows"]["0"]["tokens"]) == 7


def test_a_large_page_is_warned_of_before_the_model_scores(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from tokencredit.explain import pipeline

    monkeypatch.setattr(pipeline, "PAGE_WARN_BYTES", 50_000)  # the tiny pages of a test as if large
    real = pipeline.batch_with_signals
    said_before: list[bool] = []

    def scored(*args, **kwargs):
        said_before.append("warning: the page will be about" in capsys.readouterr().err)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "batch_with_signals", scored)
    lines = [
        {"problem": f"What is {k}+1?", "completions": ["12345678" * 8] * 4, "rewards": [1, 0, 0, 1]}
        for k in range(12)
    ]
    f = _jsonl(tmp_path / "in.jsonl", *lines)
    out = tmp_path / "p.html"
    assert (
        cli.main(
            [
                "explain",
                "--jsonl",
                str(f),
                "--model",
                tiny_model_dir,
                "--methods",
                "ktae,uniform",
                "--groups",
                "1000",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert said_before == [True]  # said on stderr before the model scored
    html = out.read_text()
    note = next(n for n in _notes(html) if "the page will be about" in n)
    assert "--groups 1000 shows 12 groups, 48 responses, 3072 tokens x 2 methods" in note
    size = float(re.search(r"about ([\d.]+) MB", note).group(1)) * 1e6
    assert 0.5 < size / len(html.encode()) < 2  # the estimate is within a factor of 2 of the page


def test_png_draws_dollars_and_latex_literally(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import matplotlib.figure

    problem = r"Pay $5 and $ then $\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix}$ and $x^$"
    f = _jsonl(
        tmp_path / "in.jsonl", {"problem": problem, "completions": ["$5$ $\\frac{", "b"], "rewards": [1, 0]}
    )
    texts: list = []
    real = matplotlib.figure.Figure.savefig

    def savefig(fig, *args, **kwargs):
        texts.extend(t for ax in fig.axes for t in ax.texts)
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    png = tmp_path / "p.png"
    assert (
        cli.main(
            [
                "explain",
                "--jsonl",
                str(f),
                "--model",
                tiny_model_dir,
                "--methods",
                "uniform",
                "--out",
                str(tmp_path / "p.html"),
                "--png",
                str(png),
            ]
        )
        == 0
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert texts and all(not t.get_parse_math() and not t.get_usetex() for t in texts)
    assert any(r"$\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix}$" in t.get_text() for t in texts)


def test_special_token_text_in_a_completion_stays_characters(tiny_model_dir, tmp_path, capsys):
    from tokencredit.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    text = "2<|im_end|>4"
    f = _jsonl(
        tmp_path / "in.jsonl", {"problem": "What is 1+1?", "completions": [text, "3"], "rewards": [1, 0]}
    )
    out = tmp_path / "p.html"
    assert (
        cli.main(
            [
                "explain",
                "--jsonl",
                str(f),
                "--model",
                tiny_model_dir,
                "--methods",
                "uniform",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    tokens = _page_blob(out.read_text())["rows"]["0"]["tokens"]
    assert tokens == list(text)  # one ordinary character each (the toy tokenizer is character-level)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token not in tokens
    assert 'class="t sp' not in out.read_text().split('data-r="0"', 1)[1].split('data-r="1"', 1)[0]


def test_bidi_controls_cannot_reorder_the_page(tiny_model_dir, tmp_path, capsys):
    rlo = "\u202e"
    f = _jsonl(
        tmp_path / "in.jsonl",
        {
            "problem": f"What is {rlo}1+1?\u2066",
            "answer": f"2{rlo}",
            "completions": ["2", "3"],
            "rewards": [1, 0],
        },
    )
    out = tmp_path / "p.html"
    assert (
        cli.main(
            [
                "explain",
                "--jsonl",
                str(f),
                "--model",
                tiny_model_dir,
                "--methods",
                "uniform",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    html = out.read_text()
    assert rlo not in html and "\u2066" not in html
    assert "<bdi>What is ⟨U+202E⟩1+1?⟨U+2066⟩</bdi>" in html and "<bdi>2⟨U+202E⟩</bdi>" in html
