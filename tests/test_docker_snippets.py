"""The Python that docker/Dockerfile runs at build time names functions that exist.

The image build runs ``python -c '...'`` snippets against the installed package; a function
moved to another module breaks the image only when it is built (minutes, and only in CI's
docker stage). This test imports every ``from rdmaxfer... import name`` those snippets use.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parent.parent / "docker" / "Dockerfile"
IMPORT = re.compile(r"from (rdmaxfer[\w.]*) import ([\w, ]+)")


def test_dockerfile_python_imports_resolve() -> None:
    found = IMPORT.findall(DOCKERFILE.read_text())
    assert found, f"no 'from rdmaxfer... import' in {DOCKERFILE}: the pattern no longer matches"
    for module_name, names in found:
        module = importlib.import_module(module_name)
        for name in (n.strip() for n in names.split(",")):
            assert hasattr(module, name), f"{DOCKERFILE.name}: {module_name} has no {name}"
