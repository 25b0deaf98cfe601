"""`mypy gq` is clean: the suite runs the type checker (pyproject.toml's [tool.mypy]) over every
module of gq, so CI (`.ci/run`, the README's `scripts/test`) fails on any type error.

Run time: about 5 s of CPU from cold (a fresh clone, as in CI), under 1 s when the cache in
the repository's .mypy_cache (mypy's default, git-ignored) is warm.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_error_in_any_module_of_gq() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "gq"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    # Not a skip: the test extra installs mypy, and a missing checker must not pass as clean.
    assert "No module named mypy" not in proc.stderr, "pip install -e '.[test]' installs mypy"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Every module was checked: [tool.mypy] names gq whole, excluding nothing.
    checked = re.search(r"no issues found in (\d+) source files", proc.stdout)
    assert checked, proc.stdout
    assert int(checked[1]) == len(list((ROOT / "gq").rglob("*.py")))
