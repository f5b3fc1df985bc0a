import json
from importlib import resources

import pytest

from tokencredit.data import DataError, Problem, load_problems, math_benchmarks
from tokencredit.errors import ConfigError


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_basic_and_field_names(tmp_path):
    f = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "a", "problem": "1+1?", "answer": "2"},
            {"question": "2+2?", "answer": 4},
            {"prompt": "amc", "answer": 142.0},
            {"idx": 7, "problem": "list", "answer": ["0.01", "0.02"]},
        ],
    )
    probs = load_problems(f)
    assert probs == [
        Problem("a", "1+1?", "2"),
        Problem("p-1", "2+2?", "4"),
        Problem("p-2", "amc", "142.0"),
        Problem("7", "list", ["0.01", "0.02"]),
    ]
    assert load_problems(f, limit=2) == probs[:2]


def test_math_style_solution_and_gsm8k_answer(tmp_path):
    f = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {
                "id": "m1",
                "problem": "x",
                "solution": "We get $\\boxed{\\frac{1}{2}}$. Check: \\boxed{\\{1,2\\}}",
            },
            {"id": "g1", "question": "y", "answer": "Natalia sold 48/2 = 24 clips.\n#### 72"},
            {"id": "b1", "problem": "z", "answer": "so \\boxed{5}"},
        ],
    )
    assert [p.answer for p in load_problems(f)] == ["\\{1,2\\}", "72", "5"]


def test_explicit_and_nested_fields(tmp_path):
    f = write_jsonl(tmp_path / "n.jsonl", [{"uid": "u1", "q": "what", "meta": {"gt": "3"}}])
    (p,) = load_problems(f, problem_field="q", answer_field="meta.gt", id_field="uid")
    assert p == Problem("u1", "what", "3")


def test_malformed_line_names_file_line_and_column(tmp_path):
    # column 30 is the "2" an editor shows there: counted in characters (the é is 2 bytes), from 1
    bad = '{"problem": "é", "answer": 1 2}'
    assert bad[30 - 1] == "2"
    f = write_jsonl(tmp_path / "bad.jsonl", [{"problem": "a", "answer": "1"}, "", bad])
    with pytest.raises(DataError, match=r"bad\.jsonl:3:30: malformed JSON line \(Expecting ',' delimiter\)$"):
        load_problems(f)
    # a line cut off mid-value: the column just past its last character, not "column 1" of the next line
    f.write_text('{"problem": "b", "answer": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1:28: malformed JSON line \(Expecting value\)"):
        load_problems(f)
    # a tab counts as one column, as json and most editors' column numbers do
    f.write_text('\t{"problem" "b"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1:13: malformed JSON line \(Expecting ':' delimiter\)"):
        load_problems(f)


def test_trailing_comma_is_named_and_a_byte_order_mark_is_read(tmp_path):
    f = tmp_path / "c.jsonl"
    line = '{"problem": "b", "answer": 4,}'
    f.write_text(line + "\n")
    # the decoder stops at the "}" (column 30); the comma it complains about is at column 29
    assert line[30 - 1] == "}" and line[29 - 1] == ","
    with pytest.raises(DataError, match=r"c\.jsonl:1:30: .*a trailing comma at column 29\?"):
        load_problems(f)
    f.write_text('{"problem": "b", "answer": "4"}\n', encoding="utf-8-sig")
    assert load_problems(f) == [Problem("c-0", "b", "4")]


def test_missing_answer_names_the_problem_id(tmp_path):
    f = write_jsonl(
        tmp_path / "x.jsonl", [{"id": "ok", "problem": "a", "answer": "1"}, {"id": "q-17", "problem": "b"}]
    )
    with pytest.raises(DataError, match=r"x\.jsonl:2: problem 'q-17' has no answer"):
        load_problems(f)
    f2 = write_jsonl(tmp_path / "y.jsonl", [{"id": "e", "problem": "a", "answer": "  "}])
    with pytest.raises(DataError, match="problem 'e' has an empty answer"):
        load_problems(f2)
    f3 = write_jsonl(tmp_path / "z.jsonl", [{"id": "s", "problem": "a", "solution": "no box at all"}])
    with pytest.raises(DataError, match="problem 's' has an empty answer"):
        load_problems(f3)


def test_other_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_problems(tmp_path / "missing.jsonl")
    f = write_jsonl(tmp_path / "np.jsonl", [{"id": "k", "answer": "1"}])
    with pytest.raises(DataError, match="problem 'k' has no problem text"):
        load_problems(f)
    f = write_jsonl(tmp_path / "dup.jsonl", [{"id": "d", "problem": "a", "answer": "1"}] * 2)
    with pytest.raises(
        DataError, match=r"dup\.jsonl:2: duplicate problem id 'd' \(first at .*dup\.jsonl:1\)"
    ):
        load_problems(f)
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(DataError, match="unknown data format"):
        load_problems(tmp_path / "a.csv")
    assert issubclass(DataError, ConfigError)


def test_parquet_with_chat_prompt_and_ground_truth(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {
            "data_source": "gsm8k",
            "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 6*7?"}],
            "reward_model": {"style": "rule", "ground_truth": "42"},
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    assert load_problems(tmp_path / "train.parquet") == [Problem("train-0", "What is 6*7?", "42")]


@pytest.mark.extras
def test_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is not installed (extra tokencredit[data])")
    rows = [{"problem": f"p{i}", "solution": f"... \\boxed{{{i}}}"} for i in range(3)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    assert [p.answer for p in load_problems(tmp_path / "ds")] == ["0", "1", "2"]
    dd = datasets.DatasetDict(
        {"test": datasets.Dataset.from_list(rows[:1]), "val": datasets.Dataset.from_list(rows)}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match="several splits"):
        load_problems(tmp_path / "dd")
    assert len(load_problems(tmp_path / "dd", split="val")) == 3
    with pytest.raises(DataError, match="no split 'train'"):
        load_problems(tmp_path / "dd", split="train")


@pytest.mark.parametrize("name", math_benchmarks.NAMES)
def test_shipped_benchmarks_load_with_documented_counts(name):
    probs = math_benchmarks.load(name)
    assert len(probs) == math_benchmarks.COUNTS[name]
    assert len({p.id for p in probs}) == len(probs)
    assert all(p.problem.strip() and p.answer for p in probs)


def test_benchmark_details():
    readme = resources.files("tokencredit.data").joinpath("math_benchmarks", "README.md").read_text()
    for name, n in math_benchmarks.COUNTS.items():  # each count as the data folder's README documents it
        assert f"| {name}.jsonl | {n:,}" in readme, name
    assert math_benchmarks.COUNTS["math500"] == 500 and len(math_benchmarks.NAMES) == 6
    amc = math_benchmarks.load("amc23", limit=3)
    assert len(amc) == 3 and amc[0].answer == "142.0"
    assert any(isinstance(p.answer, list) for p in math_benchmarks.load("minerva_math"))
    assert "sail-sg/oat" in readme and "Apache-2.0" in readme
    with pytest.raises(ConfigError, match="unknown benchmark 'math50'.*closest: math500"):
        math_benchmarks.load("math50")


def test_reasoning_gym_spec_is_not_a_file():
    # reasoning-gym data has its own loader (tokencredit.data.reasoning_gym.load, with a split)
    with pytest.raises(DataError, match="is reasoning-gym data, not a file"):
        load_problems("reasoning-gym:chain_sum?max_terms=3")


@pytest.mark.parametrize(
    "content, message",
    [
        (
            b'{"problem": "a", "answer": "1"}\n{"problem": "caf\xe9", "answer": "2"}\n',
            r"x\.jsonl:2:17: not UTF-8 text \(byte 0xe9; .*iconv",
        ),
        (bytes(range(128, 256)), r"x\.jsonl:1:1: not UTF-8 text \(byte 0x80"),
        (
            '{"problem": "a", "answer": "1"}\n'.encode("utf-16"),
            r"x\.jsonl:1:1: not UTF-8 text \(byte 0xff; UTF-16",
        ),
        (b'{"problem": "a", "answer": "1"}\n\x00\x00\n', r"x\.jsonl:2:1: a NUL character"),
        (b"[" * 50_000 + b"]" * 50_000 + b"\n", r"x\.jsonl:1: JSON nested too deeply"),
        (
            b'[{"problem": "a", "answer": "1"}]\n',
            r"x\.jsonl:1: expected a JSON object .*got an array; a JSON array",
        ),
        (b'{"problem": "a", "answer": "1"}\nnull\n', r"x\.jsonl:2: expected a JSON object .*got null$"),
        (b'{"problem": "a", "answer": "1"}\ntrue\n', r"x\.jsonl:2: expected a JSON object .*got true/false$"),
    ],
    ids=["latin-1", "binary", "utf-16", "nul", "deep", "array", "null", "bool"],
)
def test_files_that_are_not_json_lines_name_file_and_line(tmp_path, content, message):
    (tmp_path / "x.jsonl").write_bytes(content)
    with pytest.raises(DataError, match=message):
        load_problems(tmp_path / "x.jsonl")


def test_a_directory_that_is_not_a_datasets_directory(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(DataError, match=r"d: a directory, but not a `datasets` directory .*\(it is empty\)"):
        load_problems(tmp_path / "d")
    write_jsonl(tmp_path / "d" / "train.jsonl", [{"problem": "a", "answer": "1"}])
    with pytest.raises(DataError, match=r"it holds train\.jsonl; give a \.jsonl or \.parquet file"):
        load_problems(tmp_path / "d")


def _cache_dataset(cache, repo: str, files: dict[str, list[dict]], commit: str = "c" * 40) -> None:
    """`repo` in the hub cache's dataset layout (datasets--ORG--NAME/refs/main + snapshots/COMMIT/),
    holding Parquet files at the given paths inside the snapshot."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    storage = cache / ("datasets--" + repo.replace("/", "--"))
    for rel, rows in files.items():
        path = storage / "snapshots" / commit / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), path)
    # the dataset card's configs, as hub datasets with several configs declare them
    configs: dict[str, list[str]] = {}
    for rel in files:
        config, name = rel.split("/", 1)
        configs.setdefault(config, []).append(f"  - split: {name.split('-')[0]}\n    path: {config}/{name}")
    card = "".join(f"- config_name: {c}\n  data_files:\n" + "\n".join(v) + "\n" for c, v in configs.items())
    (storage / "snapshots" / commit / "README.md").write_text(f"---\nconfigs:\n{card}---\n")
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)


GSM_ROWS = [
    {"question": "What is 2+3?", "answer": "2+3=5\n#### 5"},
    {"question": "7*6?", "answer": "#### 42"},
]


@pytest.mark.extras
def test_a_hub_dataset_id_reads_the_local_cache(tmp_path, monkeypatch):
    pytest.importorskip("datasets", reason="datasets is not installed (extra tokencredit[data])")
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    layout = {"main/train-00000-of-00001.parquet": GSM_ROWS, "main/test-00000-of-00001.parquet": GSM_ROWS[1:]}
    _cache_dataset(cache, "org/gsm", {**layout, "socratic/train-00000-of-00001.parquet": GSM_ROWS[:1]})
    train = load_problems("org/gsm?config=main")  # the train split by default
    assert [(p.problem, p.answer) for p in train] == [("What is 2+3?", "5"), ("7*6?", "42")]
    test = load_problems("org/gsm?config=main&split=test")
    assert [p.answer for p in test] == ["42"]
    assert (train[0].id, test[0].id) == ("gsm-train-0", "gsm-test-0")  # distinct across splits
    with pytest.raises(DataError, match=r"org/gsm: .*[Cc]onfig.*\(choose with org/gsm\?config=NAME\)"):
        load_problems("org/gsm")  # two configs, none chosen
    with pytest.raises(DataError, match=r"no split 'tset'; available: \['train', 'test'\] \(closest: test\)"):
        load_problems("org/gsm?config=main&split=tset")


def test_a_hub_dataset_not_in_the_cache_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(DataError) as e:
        load_problems("openai/gsm8k")
    msg = str(e.value)
    assert msg.startswith(
        "openai/gsm8k: no such file or directory, and no Hugging Face dataset 'openai/gsm8k'"
    )
    assert "read only from that cache" in msg and "`hf download openai/gsm8k --repo-type dataset`" in msg
    # a path that names a data file is a missing file, not a hub id
    with pytest.raises(DataError, match=r"^data/train.jsonl: no such file or directory$"):
        load_problems("data/train.jsonl")
    with pytest.raises(DataError, match=r"unknown option 'splt' \(closest: split\)"):
        load_problems("openai/gsm8k?splt=test")


def test_a_file_without_the_usual_fields_points_at_the_field_keys(tmp_path):
    f = tmp_path / "io.jsonl"
    f.write_text(json.dumps({"input": "1+1?", "output": "2"}) + "\n")
    with pytest.raises(
        DataError, match=r"keys: \['input', 'output'\]; name the field that holds it with data.problem_field"
    ):
        load_problems(f)
    with pytest.raises(
        DataError, match=r"no answer .*keys: \['input', 'output'\]; name the field .* data.answer_field"
    ):
        load_problems(f, problem_field="input")
    assert load_problems(f, problem_field="input", answer_field="output")[0].answer == "2"
