"""Scripts of tests/ray that run in a child process with a Ray cluster of their own (so the
session's one-node Ray stays as it is), and the session fixture that starts the longest of
them when the session starts.

The lifecycle script (20 init/shutdown cycles), the two-node script and the shutdown
script take about two minutes, one minute and 20 s, and much of it is waiting on Ray (a
worker's start, a node's registration). Started early, they run beside the other Ray
tests instead of after them; their tests then read what they printed. A script whose
test was not collected never runs. The attack script's tests come first anyway.

At most ``EARLY_AT_ONCE`` early scripts run at a time: all four at once put five Ray
clusters on CI's two cores, and an actor of the session's first test took over 60 s
from ``Actor.remote()`` to answering a call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]

SCRIPTS = {  # name: its arguments, how long it may run, the file of its tests, whether it starts early
    "lifecycle_script.py": (("20",), 600.0, "test_runtime_shutdown.py", True),
    "multinode_script.py": ((), 360.0, "test_multinode.py", True),
    "attack_script.py": ((), 280.0, "test_attacks.py", False),
    "shutdown_script.py": ((), 300.0, "test_runtime_shutdown.py", True),
    "node_soak_script.py": (("6",), 480.0, "test_node_soak.py", True),
}


EARLY_AT_ONCE = 2
"""How many early scripts run beside the session's tests at once."""


class ChildScript:
    """One run of ``tests/ray/<name> *args`` in a fresh process (no RAY_ variables of this
    session's Ray), its output kept in files so that a chatty script never blocks."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.args, self.timeout_s, _, _ = SCRIPTS[name]
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None
        self._err: IO[bytes] | None = None
        self._started = 0.0
        self._done: subprocess.CompletedProcess[str] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._proc is None:
                self._start()

    def wait(self) -> None:
        """Until the script exits (at once if it never started)."""
        if self._proc is not None:
            self._proc.wait()

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "PYTHONBREAKPOINT"}
        env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self._started = time.monotonic()
        self._proc = subprocess.Popen([sys.executable, str(HERE / self.name), *self.args], env=env,
                                      cwd=ROOT, stdout=self._out, stderr=self._err, start_new_session=True)

    def result(self) -> subprocess.CompletedProcess[str]:
        """Wait for the script (starting it if need be); fail the test if it ran past its time."""
        if self._done is not None:
            return self._done
        self.start()
        assert self._proc is not None and self._out is not None and self._err is not None
        left = self.timeout_s - (time.monotonic() - self._started)
        try:
            self._proc.wait(timeout=max(left, 1.0))
        except subprocess.TimeoutExpired:
            self.stop()
            out, err = self._read()
            pytest.fail(f"{self.name} hung for {self.timeout_s:.0f} s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-6000:]}")
        out, err = self._read()
        self._done = subprocess.CompletedProcess(self._proc.args, self._proc.returncode, out, err)
        return self._done

    def checks(self) -> dict[str, dict[str, object]]:
        """The script's ``{"check": name, ...}`` lines by name; fail if the script failed."""
        done = self.result()
        found = {}
        for line in done.stdout.splitlines():
            if line.startswith('{"check"'):
                entry = json.loads(line)
                found[entry.pop("check")] = entry
        assert done.returncode == 0, f"{self.name} failed ({done.returncode}):\n{done.stderr[-4000:]}"
        return found

    def stop(self) -> None:
        """Kill the script and whatever it started in its session (its Ray nodes)."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()

    def _read(self) -> tuple[str, str]:
        assert self._out is not None and self._err is not None
        texts = []
        for f in (self._out, self._err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
            f.close()
        return texts[0], texts[1]


class ChildScripts:
    """The session's child scripts by name (``get`` makes one on first use)."""

    def __init__(self) -> None:
        self.scripts: dict[str, ChildScript] = {}
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(EARLY_AT_ONCE)
        self._stopping = False

    def get(self, name: str) -> ChildScript:
        with self._lock:
            if name not in self.scripts:
                self.scripts[name] = ChildScript(name)
            return self.scripts[name]

    def start_early(self, collected: set[str]) -> None:
        """Start the scripts marked early whose test file is in ``collected`` (file names),
        ``EARLY_AT_ONCE`` at a time, in ``SCRIPTS``' order; a test that needs one sooner
        starts it itself."""
        for name, (_, _, tests, early) in SCRIPTS.items():
            if early and tests in collected:
                threading.Thread(target=self._run_early, args=(self.get(name),), daemon=True).start()

    def _run_early(self, script: ChildScript) -> None:
        with self._slots:
            if not self._stopping:
                script.start()
                script.wait()

    def stop(self) -> None:
        self._stopping = True
        for script in list(self.scripts.values()):
            script.stop()
