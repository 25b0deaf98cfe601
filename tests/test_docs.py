"""The docs stay true to the code they name: the README points to docs/ARCHITECTURE.md, every
link in the README and every file the architecture page names exists, and every `Class.method`
it names is there (a renamed module or method fails here, not in a newcomer's hands)."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
#: Where the classes the architecture page names by `Class.attr` live.
CLASSES = {"Store": "gq.store", "JobTable": "gq.head.jobs", "Head": "gq.head.core",
           "HeadServer": "gq.head.daemon", "Listings": "gq.head.listings",
           "NodeDaemon": "gq.node.daemon", "Client": "gq.client"}


def test_the_readme_points_to_the_architecture_page_and_its_links_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert "docs/ARCHITECTURE.md" in links
    for link in links:
        if "://" not in link:
            assert (ROOT / link).exists(), link


def test_every_module_and_method_the_architecture_page_names_exists() -> None:
    text = ARCHITECTURE.read_text()
    paths = set(re.findall(r"`((?:gq|tests|man|docs)/[\w./*<>-]+)`", text))
    assert len(paths) > 60, paths  # the page names the modules a job passes through
    for path in sorted(paths):
        if "*" in path or "<" in path:  # `gq/node/cgroups*.py`, `gq/slurm/<command>.py`
            assert list(ROOT.glob(re.sub(r"<\w+>", "*", path))), path
        else:
            assert (ROOT / path).exists(), path
    # Modules named by their short names beside a package's (`priority.py` in gq/sched/).
    for name in re.findall(r"`(\w+)\.py`", text):
        assert list((ROOT / "gq").rglob(f"{name}.py")), name
    named = set(re.findall(r"`(\w+)\.(\w+)`", text)) - {("gq", "errors")}
    for cls, attr in sorted(named):
        if cls in CLASSES:  # a method, or an attribute its instances are given
            found = getattr(importlib.import_module(CLASSES[cls]), cls)
            assert hasattr(found, attr) or re.search(rf"self\.{attr}\b", inspect.getsource(found)), (
                cls, attr)
        elif cls in ("protocol", "shepherd", "errors"):
            module = {"protocol": "gq.protocol", "shepherd": "gq.node.shepherd",
                      "errors": "gq.errors"}[cls]
            assert hasattr(importlib.import_module(module), attr), (cls, attr)
    assert hasattr(importlib.import_module("gq.errors"), "end")
