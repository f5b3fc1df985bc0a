"""The package as installed: one version, and `import tokencredit` stays light."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import tokencredit


def test_version_is_the_distribution_version():
    # pyproject reads the version from tokencredit.__version__; a stale install (the version changed
    # without a reinstall) shows here.
    assert tokencredit.__version__ == importlib.metadata.version("tokencredit")


def test_py_typed_marker_ships():
    assert (Path(tokencredit.__file__).parent / "py.typed").is_file()


def test_import_is_light():
    code = "import sys, tokencredit; print(sorted({'torch', 'transformers', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
