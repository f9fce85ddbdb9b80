"""Run every fuzz target for N seconds each, one subprocess per target.

    python fuzz/run_all.py --seconds 60 [--targets manifest,pack] [--jobs 1]

Each target runs under libFuzzer with ``-rss_limit_mb=2048`` (memory bounded) and ``-timeout``
(no hang), starting from fuzz/corpus/<target>/ (read-only seeds) and writing new inputs to
fuzz/work/<target>/ (ignored by git).  Crashers land in fuzz/crashers/; each one must become a
test in tests/security/test_fuzz_regressions.py.  Exit status is non-zero when any target failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGETS = ("manifest", "pack", "index", "objects", "refs", "config")


def run_target(name: str, seconds: int, timeout: int, rss_mb: int, extra: list[str]) -> int:
    work = os.path.join(HERE, "work", name)
    crashers = os.path.join(HERE, "crashers")
    os.makedirs(work, exist_ok=True)
    os.makedirs(crashers, exist_ok=True)
    cmd = [sys.executable, os.path.join(HERE, f"fuzz_{name}.py"), work, os.path.join(HERE, "corpus", name),
           f"-max_total_time={seconds}", f"-rss_limit_mb={rss_mb}", f"-timeout={timeout}",
           f"-artifact_prefix={crashers}{os.sep}{name}-", "-print_final_stats=1", *extra]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.monotonic()
    # the outer timeout catches a target that wedges libFuzzer itself
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 120)
        rc, out = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = -9, (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr)
    stats = [line for line in out.splitlines() if line.startswith(("stat::number_of_executed_units", "stat::peak_rss_mb"))]
    status = "ok" if rc == 0 else f"FAILED (rc={rc})"
    print(f"{name:10s} {status:16s} {time.monotonic() - t0:6.1f}s  " + "  ".join(s.split("::")[1] for s in stats))
    if rc != 0:
        print("\n".join(out.splitlines()[-40:]))
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=60, help="fuzzing time per target")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset")
    ap.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    ap.add_argument("--rss-limit-mb", type=int, default=2048)
    ap.add_argument("extra", nargs="*", help="more libFuzzer flags, e.g. -seed=1")
    args = ap.parse_args(argv)
    failed = 0
    for name in args.targets.split(","):
        failed += run_target(name, args.seconds, args.timeout, args.rss_limit_mb, args.extra) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
