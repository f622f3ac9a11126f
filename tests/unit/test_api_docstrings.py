"""The public API is documented: every name of ``cgraph.__all__`` and
``cgraph.collective.__all__`` has a docstring, and so has every public method and
property a cgraph class defines (methods inherited from Ray's classes are Ray's to
document). ``make docs`` renders these docstrings with pdoc (docs/design-notes.md).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest

import cgraph
import cgraph.collective

PUBLIC = [("cgraph", name) for name in cgraph.__all__] + [
    ("cgraph.collective", name) for name in cgraph.collective.__all__
]


def _public(module: str, name: str) -> Any:
    return getattr(cgraph if module == "cgraph" else cgraph.collective, name)


def _doc(obj: Any) -> str:
    """The object's own docstring (a callable object's is its class's)."""
    return (inspect.getdoc(obj) or "").strip()


def undocumented_members(cls: type) -> list[str]:
    """Public methods and properties that cgraph classes in ``cls``'s MRO define without a docstring."""
    missing = []
    for klass in cls.__mro__:
        if not klass.__module__.startswith("cgraph"):
            continue  # Ray's, the standard library's: documented there
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if not callable(func) and not isinstance(member, property):
                continue  # a plain class attribute or an enum member
            if not (getattr(func, "__doc__", None) or "").strip():
                missing.append(f"{klass.__module__}.{klass.__qualname__}.{name}")
    return missing


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[f"{m}.{n}" for m, n in PUBLIC])
def test_every_public_name_has_a_docstring(module: str, name: str) -> None:
    obj = _public(module, name)
    assert _doc(obj), f"{module}.{name} has no docstring"


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[f"{m}.{n}" for m, n in PUBLIC])
def test_every_public_method_of_a_public_class_has_a_docstring(module: str, name: str) -> None:
    obj = _public(module, name)
    cls = obj if inspect.isclass(obj) else type(obj)
    if inspect.isclass(obj) or type(obj).__module__.startswith("cgraph"):
        assert undocumented_members(cls) == [], f"{module}.{name}: methods without a docstring"


def test_public_functions_say_what_they_raise_or_return() -> None:
    """The entry points users call first carry Args, Returns and Raises sections."""
    for obj in (cgraph.compile, cgraph.plan, cgraph.with_type_hint):
        doc = _doc(obj)
        for section in ("Args:", "Returns:", "Raises:"):
            assert section in doc, f"{obj.__name__}: no {section} section"


def test_the_api_reference_renders_without_warnings() -> None:
    """What ``make docs`` builds (scripts/build_docs.py), rendered in this process."""
    pdoc_doc = pytest.importorskip("pdoc.doc")
    pdoc_render = pytest.importorskip("pdoc.render")
    pdoc_render.configure(docformat="google", show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        modules = {name: pdoc_doc.Module.from_name(name) for name in ("cgraph", "cgraph.collective")}
        pages = {name: pdoc_render.html_module(module, modules) for name, module in modules.items()}
    assert not [str(w.message) for w in caught]
    for module, name in PUBLIC:
        assert f'id="{name}"' in pages[module], f"{module}.{name} is missing from the reference"
