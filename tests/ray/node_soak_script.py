"""Run by test_node_soak.py in its own process: a short run of the fault soak across two
loopback nodes (``benchmarks/fault_soak.py --nodes 2``), one trial of each fault across
nodes; prints its summary and every problem as one JSON check line."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="cgraph-node-soak-") as folder:
        out = Path(folder) / "soak"
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fault_soak.py"), "--nodes", "2",
                               "--trials", sys.argv[1] if len(sys.argv) > 1 else "6", "--seed", "11",
                               "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0 or not out.with_suffix(".json").exists():
            print(done.stdout[-3000:], done.stderr[-6000:], file=sys.stderr)
            return 1
        results = json.loads(out.with_suffix(".json").read_text())
    problems = [f"trial {t['trial']} ({t['fault']}): {p}" for t in results["trials"]
                for p in (*t["hangs"], *t["wrong"], *t["leaks"])]
    print(json.dumps({"check": "node_soak", "summary": results["summary"], "problems": problems,
                      "faults": [t["fault"] for t in results["trials"]],
                      "stranger_doors": [t.get("stranger_doors") for t in results["trials"]
                                         if t["fault"] == "stranger"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
