"""``Any`` only at the boundary (issue 28): every ``Any`` of the package is one of the named
aliases of ``cgraph/_boundary.py`` (a Ray handle or object, a torch object its stubs do not
type, a user's value); anything of cgraph's own has its real type. mypy checks the whole
package (``make lint``)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cgraph"
BOUNDARY = PACKAGE / "_boundary.py"


def bare_any(source: str) -> list[int]:
    """The lines of ``source`` that name ``typing.Any`` (imported, annotated or ``typing.Any``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in ("typing", "typing_extensions"):
            lines += [node.lineno for alias in node.names if alias.name == "Any"]
        elif isinstance(node, ast.Attribute) and node.attr == "Any" and isinstance(node.value, ast.Name) \
                and node.value.id in ("typing", "t"):
            lines.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() \
                and _is_annotation_text(node.value):
            lines += [node.lineno] if "Any" in _names(node.value) else []
    return sorted(set(lines))


def _is_annotation_text(text: str) -> bool:
    try:
        ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    return len(text) < 200 and "\n" not in text


def _names(text: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}


def test_any_appears_only_in_the_boundary_module() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == BOUNDARY:
            continue
        lines = bare_any(path.read_text())
        if lines:
            found[str(path.relative_to(PACKAGE.parent))] = lines
    assert found == {}, ("name the boundary (cgraph._boundary: ActorHandle, RayObject, TorchObject, "
                         f"UserValue) or give the real type: {found}")


def test_the_check_sees_an_import_an_attribute_and_a_quoted_annotation() -> None:
    assert bare_any("from typing import Any\nx: Any = 1\n") == [1]
    assert bare_any("import typing\ndef f(x: typing.Any) -> None: ...\n") == [2]
    assert bare_any("def f(x: 'dict[str, Any]') -> None: ...\n") == [1]
    assert bare_any("from cgraph._boundary import UserValue\ndef f(x: UserValue) -> None: ...\n") == []
