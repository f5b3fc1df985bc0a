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
