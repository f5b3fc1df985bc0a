import subprocess
import sys

from tokencredit import cli


def test_recipes_lists_every_recipe(capsys):
    from tokencredit.recipes import RECIPES

    assert cli.main(["recipes"]) == 0
    out = capsys.readouterr().out
    for name in RECIPES:
        assert name in out


def test_help_and_unknown_command():
    assert cli.main(["--help"]) == 0
    r = subprocess.run([sys.executable, "-m", "tokencredit.cli", "trian"], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_version():
    from tokencredit import __version__

    r = subprocess.run([sys.executable, "-m", "tokencredit.cli", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"tokencredit {__version__}"
    assert (
        "--version"
        in subprocess.run(
            [sys.executable, "-m", "tokencredit.cli", "--help"], capture_output=True, text=True
        ).stdout
    )


# What a command imported before answering: `--help` and a bad flag must not wait for torch (~2 s of
# CPU) or transformers (~5 s); a config typo is reported before the model library loads.
_IMPORTED = """
import sys
from tokencredit import cli
try:
    code = cli.main({argv!r})
except SystemExit as e:
    code = e.code
print(code, "torch" in sys.modules, "transformers" in sys.modules)
"""


def _imported(argv: list[str]) -> tuple[str, bool, bool]:
    r = subprocess.run([sys.executable, "-c", _IMPORTED.format(argv=argv)], capture_output=True, text=True)
    code, torch, transformers = r.stdout.split()[-3:]
    return code, torch == "True", transformers == "True"


def test_help_and_bad_flags_answer_before_torch_loads():
    assert _imported(["--help"]) == ("0", False, False)
    assert _imported(["train", "--help"]) == ("0", False, False)
    assert _imported(["train", "--stpes", "3"]) == ("2", False, False)


def test_a_config_typo_is_reported_before_the_model_library_loads():
    code, _, transformers = _imported(["train", "--set", "optim.lrr=1e-4"])
    assert code == "2" and not transformers
    # a recipe parameter is checked by the trainer, still before any model (or transformers) loads
    code, _, transformers = _imported(
        ["train", "--recipe", "strace", "--set", "algo.kernel_params.lamda=0.9"]
    )
    assert code == "2" and not transformers


def test_third_party_warnings_are_hidden_and_ours_kept(monkeypatch):
    import warnings

    monkeypatch.setattr(sys, "warnoptions", [])
    monkeypatch.delenv("TOKENCREDIT_DEBUG", raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli.quiet_third_party_warnings()
        warnings.warn_explicit("deprecated", FutureWarning, "x.py", 1, module="transformers.utils")
        warnings.warn_explicit("loud", UserWarning, "x.py", 1, module="torch.nn.modules")
        warnings.warn_explicit("ours", RuntimeWarning, "credit.py", 1, module="tokencredit.credit")
        warnings.warn_explicit("ours too", UserWarning, "x.py", 1, module="tokencredit.advantages")
    assert [str(w.message) for w in seen] == ["ours", "ours too"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        monkeypatch.setenv("TOKENCREDIT_DEBUG", "1")  # everything shown
        cli.quiet_third_party_warnings()
        warnings.warn_explicit("deprecated", FutureWarning, "x.py", 1, module="transformers.utils")
    assert len(seen) == 1
