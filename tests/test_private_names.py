"""No module of the package reaches into another module's private names: an attribute
``x._name`` read or written anywhere but on ``self``/``cls`` must name something the same
module defines (its own classes' internals); what other modules need is a public method
(underscore-free, and left out of ``__all__`` when internal)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "rdmaxfer"

#: Private names of other libraries the package has to use (none of ours).
FOREIGN = {
    "_get_default_store",  # torch.distributed: the default store of a process group
    "_getframe",  # sys: the caller's frame, for a warning's stack level
    # Ray (rdmaxfer.ray): an actor handle's id; the GCS key-value store; registering Ray's own
    # tensor transports before asking whether ours is registered
    "_actor_id",
    "_internal_kv_get",
    "_internal_kv_put",
    "_ensure_default_transports_registered",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, assignments (``_x = ...``,
    ``self._x = ...``), annotated attributes and slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries, namedtuple fields
    return {n for n in names if _private(n)}


def test_no_module_reaches_into_another_modules_private_names() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        own = _defined(tree) | FOREIGN
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr not in own:
                rel = path.relative_to(PACKAGE)
                wrong.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert wrong == []
