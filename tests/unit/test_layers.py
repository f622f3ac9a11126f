"""cgraph's packages form layers (../shared/DESIGN.md): each imports only layers below it.

Every import of every module is walked, those inside functions included, and each
edge between two packages is checked against the layer table: a package imports
only packages of lower layers (not its neighbours on the same layer), so there is
no import loop between packages, and none can come back.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cgraph"

LAYERS = {
    "_boundary": -1,  # the names of what cannot be typed: every layer may use them
    "errors": 0, "_log": 0, "_spans": 0, "_threads": 0,
    "ir": 1, "channels": 1,
    "scheduler": 2, "dag": 2, "comm": 2,
    "runtime": 3, "visualize": 3, "collective": 3,
    "compiler": 4,
    "compat": 5,  # the Ray compatibility layer: InputNode, MultiOutputNode, experimental_compile
    "cgraph": 6,  # cgraph/__init__.py: the public names, loaded lazily from the layers below
}  # fmt: skip



def package_of(module: str) -> str:
    """``cgraph.runtime.executor`` -> "runtime"; ``cgraph.errors`` -> "errors"; ``cgraph`` -> "cgraph"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "cgraph"


def imports(path: Path) -> set[str]:
    """Every cgraph module ``path`` imports, wherever the import statement sits."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:  # ``from cgraph import visualize`` imports a subpackage
                sub = PACKAGE.parent.joinpath(*module.split("."), alias.name)
                found.add(f"{module}.{alias.name}" if sub.is_dir() or sub.with_suffix(".py").exists() else module)
    return {name for name in found if name == "cgraph" or name.startswith("cgraph.")}


def edges() -> set[tuple[str, str]]:
    out = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent)
        source = "cgraph" if rel.parts == ("cgraph", "__init__.py") else package_of(".".join(rel.with_suffix("").parts))
        for target in map(package_of, imports(path)):
            if target != source:
                out.add((str(rel), target))
    return out


def test_every_package_has_a_layer() -> None:
    packages = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}
    assert packages - set(LAYERS) == set(), "give the new package a layer here and in DESIGN.md"


def test_no_import_climbs_or_crosses_a_layer() -> None:
    climbing = {(path, target) for path, target in edges()
                if LAYERS[target] >= LAYERS[package_of(".".join(Path(path).with_suffix("").parts))
                                             if path != "cgraph/__init__.py" else "cgraph"]}
    assert climbing == set(), "these imports climb the layers (DESIGN.md): import downwards"


def test_the_walk_sees_imports_inside_functions_and_subpackages() -> None:
    assert ("cgraph/collective/dag_ops.py", "dag") in edges()  # a function-local import
    assert ("cgraph/compiler.py", "visualize") in edges()  # from cgraph import visualize


# --------------------------------------------------------------------------- files
def module_of(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def file_edges() -> dict[str, set[str]]:
    """Module -> the cgraph modules it imports (not packages' __init__), anywhere in the file."""
    modules = {module_of(p) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    out: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        me = module_of(path)
        here = me.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join([*here[: len(here) - node.level + 1], *([node.module] if node.module else [])]) \
                    if node.level else (node.module or "")
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            out.setdefault(me, set()).update(n for n in names if n in modules and n != me)
    return out


def circles() -> set[frozenset[str]]:
    """Every set of modules that import each other, directly or around a ring."""
    edges = file_edges()

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {m: reach(m) for m in edges}
    return {frozenset(x for x in reached[m] if m in reached.get(x, ())) | {m}
            for m in edges if m in reached[m]}


KNOWN_CIRCLES: set[frozenset[str]] = set()  # none left (issue 28): keep it empty


def test_no_two_files_import_each_other() -> None:
    """Two files that import each other (a function-local or TYPE_CHECKING import counts) are
    one concept cut in two, or share a thing that wants its own module (STYLE.md, item 9)."""
    found = circles()
    assert found - KNOWN_CIRCLES == set(), "new import circles: merge the files or move the shared part out"
    assert KNOWN_CIRCLES - found == set(), "a known circle is gone: take it off KNOWN_CIRCLES"


def test_the_file_walk_sees_function_local_imports() -> None:
    assert "cgraph.dag.adapter_collective" in file_edges()["cgraph.collective.dag_ops"]  # inside _bind
    assert "cgraph.runtime.compiled_graph" not in file_edges()["cgraph.runtime.results"]  # a Protocol now


def test_the_design_notes_map_lists_every_module_and_no_other() -> None:
    """docs/design-notes.md's "Where things live" names each module under its package's
    heading: a module added, moved or merged away must be moved in the map too."""
    import re

    notes = (PACKAGE.parent / "docs" / "design-notes.md").read_text()
    section = notes.split("## Where things live", 1)[1].split("\n### ", 1)[0]
    listed, package = set(), None
    for line in section.splitlines():
        heading = re.fullmatch(r"\*\*`(cgraph/[\w/]*)`\*\*", line.strip())
        if heading:
            package = heading.group(1)
        elif package and (item := re.match(r"- `(\w+\.py)`:", line)):
            listed.add(package + item.group(1))
    tree = {str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")}
    assert listed - tree == set(), "the map names modules that are gone"
    assert tree - listed == set(), "modules missing from the map"
