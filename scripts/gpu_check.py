"""``make gpu-check``: what this machine's GPUs can do with cgraph, one line per check.

    environment   torch, CUDA and NCCL versions, the GPUs, peer-to-peer access between them
    checks        tests/gpu (CUDA IPC and NCCL communicators, the seed on one shared GPU
                  with overlap off and on, two GPUs on NCCL, CUDA tensors through shared
                  memory), each PASS / FAIL / NOT RUN with the reason; the CUDA IPC check
                  again under TORCH_CUDA_SANITIZER=1; the overlap example on the GPU
    no CUDA       says so, and runs the CPU model of the same logic instead (the NCCL
                  communicator's code on gloo, streams modelled on the CPU, the CUDA IPC
                  protocol with a stand-in, placement on Ray's logical GPUs, the send fence)

With CUDA, the run is appended to benchmarks/results/gpu.json, from which the README's
GPU status is written (scripts/readme_tables.py). Exit status: 1 when a check that could
run failed, else 0.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "gpu.json"
CPU_MODEL = [
    "tests/unit/test_comm_process_group.py",
    "tests/unit/test_stream_model.py",
    "tests/unit/test_cuda_ipc_protocol.py",
    "tests/unit/test_gpu_placement.py",
    "tests/ray/test_gpu_placement.py",
    "tests/ray/test_transport_send_race.py",
]


def environment() -> bool:
    import torch

    print(f"torch {torch.__version__}")
    if not torch.cuda.is_available():
        print("CUDA: not available here (no GPU, or a CPU build of torch)")
        return False
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else "none"
    print(f"CUDA {torch.version.cuda}, NCCL {nccl}")
    count = torch.cuda.device_count()
    for i in range(count):
        peers = [j for j in range(count) if j != i and torch.cuda.can_device_access_peer(i, j)]
        print(f"GPU {i}: {torch.cuda.get_device_name(i)}; peer-to-peer with {peers or 'none'}")
    print(f"Ray will see {count} GPU(s) on this node")
    return True


def run_pytest(paths: list[str], env: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(test, PASS/FAIL/NOT RUN, reason) per test of ``paths``."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        subprocess.run([sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider",
                        f"--junitxml={report}"], cwd=ROOT, env={**os.environ, **(env or {})},
                       stdout=subprocess.DEVNULL, check=False)
        if not report.exists():
            return [(" ".join(paths), "FAIL", "pytest did not run")]
        rows = []
        for case in ET.parse(report).getroot().iter("testcase"):
            name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
            failed = case.find("failure") if case.find("failure") is not None else case.find("error")
            skipped = case.find("skipped")
            if failed is not None:
                rows.append((name, "FAIL", (failed.get("message") or "").splitlines()[0][:160]))
            elif skipped is not None:
                rows.append((name, "NOT RUN", (skipped.get("message") or "").removeprefix("Skipped: ")))
            else:
                rows.append((name, "PASS", ""))
        return rows


def show(rows: list[tuple[str, str, str]]) -> bool:
    for name, verdict, why in rows:
        print(f"{verdict:8} {name}" + (f" ({why})" if why else ""))
    return all(verdict != "FAIL" for _, verdict, _ in rows)


def counts(rows: list[tuple[str, str, str]]) -> dict[str, int]:
    return {verdict: sum(v == verdict for _, v, _ in rows) for verdict in ("PASS", "FAIL", "NOT RUN")}


def this_run(checks: list[tuple[str, str, str]], sanitizer: list[tuple[str, str, str]], example: str,
             auto: list[str] | None = None) -> dict:
    """This machine's GPU run as one record of benchmarks/results/gpu.json."""
    import torch

    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else "none"
    return {
        "date": datetime.date.today().isoformat(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
        "checks": counts(checks),
        "not_run": [f"{name} ({why})" for name, verdict, why in checks if verdict == "NOT RUN"],
        "sanitizer": counts(sanitizer),
        "overlap_example": example,
        "overlap_auto": auto or [],  # what overlap="auto" chose on the GPU, and why (the example's lines)
    }


def record(run: dict, path: Path = RECORD) -> None:
    """Append ``run`` to ``path`` (benchmarks/results/gpu.json), the one source of the README's
    GPU status (scripts/readme_tables.py writes it from there)."""
    data = json.loads(path.read_text()) if path.exists() else {"runs": []}
    data["runs"].append(run)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"recorded in {path}; scripts/readme_tables.py puts it in the README")


def main() -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    has_cuda = environment()
    print()
    if not has_cuda:
        print("No CUDA: running the CPU model of the same checks")
        return 0 if show(run_pytest(CPU_MODEL)) else 1
    checks = run_pytest(["tests/gpu"])
    ok = show(checks)
    print("under TORCH_CUDA_SANITIZER=1:")
    sanitizer = run_pytest(["tests/gpu/test_gpu_communicators.py"], {"TORCH_CUDA_SANITIZER": "1"})
    ok = show(sanitizer) and ok
    print("the overlap example on the GPU:")
    example = subprocess.run([sys.executable, "examples/overlap.py"], cwd=ROOT, capture_output=True, text=True,
                             check=False)
    print("\n".join(line for line in example.stdout.splitlines() if "duration" in line or "speedup" in line or line.startswith("auto")))
    verdict = "PASS" if example.returncode == 0 else "FAIL"
    print(f"{verdict:8} examples/overlap.py")
    record(this_run(checks, sanitizer, verdict, [line for line in example.stdout.splitlines()
                                                 if line.startswith("auto")]))
    return 0 if ok and example.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
