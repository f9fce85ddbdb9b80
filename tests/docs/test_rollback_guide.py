"""docs/guide/rollback.md: every code block runs as written, in order, in an empty folder (python
blocks share one namespace, as a reader pasting them into one session would; bash blocks run the
real ``deltackpt`` command)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.conftest import ROOT

GUIDE = os.path.join(ROOT, "docs", "guide", "rollback.md")
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```$", re.S | re.M)

DRIVER = """
import json, subprocess, sys
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__guide__"}
for i, (lang, code) in enumerate(blocks):
    if lang == "python":
        exec(compile(code, f"rollback.md block {i}", "exec"), ns)
    else:
        subprocess.run(code, shell=True, check=True, executable="/bin/bash")
"""


def test_every_code_block_of_the_rollback_guide_runs(tmp_path):
    with open(GUIDE) as f:
        blocks = BLOCK.findall(f.read())
    assert [lang for lang, _ in blocks].count("python") >= 3 and "bash" in {lang for lang, _ in blocks}
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "driver.py").write_text(DRIVER)
    work = tmp_path / "work"
    work.mkdir()
    # `deltackpt` on PATH runs this checkout's CLI
    shim = tmp_path / "bin" / "deltackpt"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m deltackpt.cli.main \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": ROOT, "PATH": f"{shim.parent}:{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "blocks.json")], cwd=work,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rollbacks (newest first)" in proc.stdout and "restored bit-identical" in proc.stdout
