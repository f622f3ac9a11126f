"""Print cgraph's line budget: lines per package and the largest modules.

STYLE.md asks modules to stay under ~400 lines (600 at most) and functions
under 60; this makes growth visible. Run: `python scripts/line_budget.py`.
"""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "cgraph"


def main() -> int:
    per_package: dict[str, int] = {}
    modules: list[tuple[int, str]] = []
    long_functions: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        src = path.read_text()
        lines = src.count("\n")
        rel = path.relative_to(ROOT.parent)
        package = str(rel.parent)
        per_package[package] = per_package.get(package, 0) + lines
        modules.append((lines, str(rel)))
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    long_functions.append(f"{rel}:{node.lineno} {node.name} ({length} lines)")
    out = sys.stdout
    out.write(f"{'package':<32} {'lines':>7}\n")
    for package, lines in sorted(per_package.items()):
        out.write(f"{package:<32} {lines:>7}\n")
    out.write(f"{'total':<32} {sum(per_package.values()):>7}\n\nlargest modules:\n")
    for lines, name in sorted(modules, reverse=True)[:8]:
        flag = "  over 600!" if lines > 600 else ("  over 400" if lines > 400 else "")
        out.write(f"  {lines:>5}  {name}{flag}\n")
    if long_functions:
        out.write("\nfunctions over 60 lines:\n" + "".join(f"  {f}\n" for f in long_functions))
    return 1 if any(lines > 600 for lines, _ in modules) or long_functions else 0


if __name__ == "__main__":
    raise SystemExit(main())
