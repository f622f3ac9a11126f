"""Draw DOT text with graphviz's ``dot`` program, or leave a .dot file when it is missing.

The DOT builders (``dag_to_dot``, ``schedule_to_dot``) only return text; this is
the one place that touches the file system or graphviz, and only when called.
``dot`` is looked up on PATH at call time, so a machine without graphviz still
gets a ``.dot`` file and a log line saying how to install it.

    render(schedule_to_dot(after, before), "/tmp/overlap")   # -> /tmp/overlap.png
    write_schedule_picture(after, before)   # -> ./cgraph-schedules/schedule-001.png
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from cgraph.visualize.dag_dot import dag_to_dot
from cgraph.visualize.schedule_dot import schedule_to_dot

if TYPE_CHECKING:
    from cgraph.ir.graph import Graph
    from cgraph.scheduler.channels import ChannelPlan
    from cgraph.scheduler.ops import Schedule

logger = logging.getLogger("cgraph")

FORMATS = ("png", "svg", "pdf")
DIR_ENV = "CGRAPH_VISUALIZE_DIR"
DEFAULT_DIR = "cgraph-schedules"
INSTALL_HINT = (
    "graphviz's `dot` program is not on PATH, so {path} holds the DOT text instead of a "
    "{format} picture. Install graphviz to get pictures: Debian/Ubuntu "
    "`sudo apt-get install graphviz`, macOS `brew install graphviz`, conda "
    "`conda install graphviz`; or render the file later with `dot -T{format} {path} -o out.{format}`."
)
_TIMEOUT_S = 60


def _base(path: Path) -> Path:
    """``path`` without a picture or .dot suffix: ``x.png`` and ``x`` both give ``x``."""
    if path.suffix.lstrip(".") in (*FORMATS, "dot", "gv"):
        return path.with_suffix("")
    return path


def render(dot_text: str, path: str | os.PathLike[str], format: str = "png") -> Path:
    """Write ``dot_text`` as a picture at ``<path>.<format>``, or as ``<path>.dot``.

    Args:
        dot_text: DOT source, e.g. from ``schedule_to_dot``.
        path: where to write; a trailing ``.png``/``.svg``/``.pdf``/``.dot`` is replaced.
        format: "png", "svg" or "pdf".

    Returns:
        The path written: the picture when ``dot`` is on PATH, else the ``.dot``
        file (a warning on logger "cgraph" says how to install graphviz).

    Raises:
        ValueError: on an unknown format.
        RuntimeError: if ``dot`` rejects the text (its message is included).
    """
    if format not in FORMATS:
        raise ValueError(f"unknown picture format {format!r}: use one of {', '.join(FORMATS)}")
    base = _base(Path(path))
    base.parent.mkdir(parents=True, exist_ok=True)
    exe = shutil.which("dot")
    if exe is None:
        target = base.with_name(base.name + ".dot")
        target.write_text(dot_text, encoding="utf-8")
        logger.warning(INSTALL_HINT.format(path=target, format=format))
        return target
    target = base.with_name(f"{base.name}.{format}")
    done = subprocess.run(
        [exe, f"-T{format}", "-o", str(target)],
        input=dot_text.encode("utf-8"),
        capture_output=True,
        timeout=_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip()
        raise RuntimeError(f"graphviz `dot -T{format}` failed for {target}: {message}")
    return target


def _free_base(directory: Path, name: str) -> Path:
    """``directory/name-NNN`` with the first NNN no file of any suffix uses yet."""
    if not name or Path(name).name != name or name in (".", ".."):
        raise ValueError(f"name {name!r} must be a plain file name (no directories)")
    taken = {p.name.split(".", 1)[0] for p in directory.glob(f"{name}-*")}
    k = 1
    while f"{name}-{k:03d}" in taken:
        k += 1
    return directory / f"{name}-{k:03d}"


def _write_picture(
    dot_text: str, directory: str | os.PathLike[str] | None, name: str, format: str, what: str
) -> Path:
    if directory is None:
        directory = os.environ.get(DIR_ENV) or Path.cwd() / DEFAULT_DIR
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = render(dot_text, _free_base(folder, name), format)
    logger.info("wrote %s picture %s", what, written)
    return written


def write_schedule_picture(
    schedule: Schedule,
    before: Schedule | None = None,
    *,
    directory: str | os.PathLike[str] | None = None,
    name: str = "schedule",
    format: str = "png",
    title: str | None = None,
) -> Path:
    """Draw a schedule (ops moved since ``before`` in red) into a new numbered file.

    Called when the user opted in (``CGRAPH_VISUALIZE_SCHEDULE=1``).

    Args:
        schedule: the schedule to draw.
        before: the schedule before a pass, to mark moved ops.
        directory: where to write; default ``$CGRAPH_VISUALIZE_DIR``, else
            ``./cgraph-schedules``. Created if missing.
        name: file name stem; the file is ``<name>-NNN.<format>`` (or ``.dot``).
        format: "png", "svg" or "pdf".
        title: caption of the picture.

    Returns:
        The path written (logged at INFO on logger "cgraph").
    """
    return _write_picture(schedule_to_dot(schedule, before, title), directory, name, format, "schedule")


def write_dag_picture(
    graph: Graph,
    plan: ChannelPlan | None = None,
    *,
    directory: str | os.PathLike[str] | None = None,
    name: str = "dag",
    format: str = "png",
) -> Path:
    """Draw a Graph IR (edges labelled with transports) into a new numbered file.

    Same directory and naming rules as ``write_schedule_picture``.
    """
    return _write_picture(dag_to_dot(graph, plan), directory, name, format, "dag")
