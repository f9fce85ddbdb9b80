"""Figures for tests/RELIABILITY.md (issue 16, items 8-11): every hostile case of
test_nested_manifests / test_special_files / test_name_anchors, probed in a child process, printed
as outcome | wall ms in the child (imports included) | peak RSS (VmHWM).

    python -m tests.security.hostile_figures [IMPL [TIMEOUT_S [CASE,CASE...]]]

IMPL: a folder holding a ``deltackpt`` package to probe (default: this checkout); to compare with an
older commit, ``git archive <commit> deltackpt | tar -x -C /tmp/old`` and pass /tmp/old.  The
repositories are built with this checkout's deltackpt in a temporary folder.
"""
import json, os, shutil, subprocess, sys, tempfile, time

import msgpack
from tests.security._hostile import make_repo, commit_raw_manifest, manifest_body, nested_tuples, latest
from deltackpt.format import manifest as mf
from deltackpt.format import index as index_fmt
from deltackpt.format.ids import hex_id

from tests.conftest import ROOT

IMPL = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else ROOT
TIMEOUT = float(sys.argv[2]) if len(sys.argv) > 2 else 20
only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
PROBE = os.path.join(ROOT, "tests", "security", "_probe.py")
W = tempfile.mkdtemp(prefix="hostile-figures-")

def probe(mode, repo, *args):
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, PROBE, mode, repo, *args], cwd=IMPL,
                           env={**os.environ, "PYTHONPATH": IMPL}, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"HANG (killed after {TIMEOUT:.0f} s)"
    if p.returncode:
        return f"died rc={p.returncode}"
    r = json.loads([l for l in p.stdout.splitlines() if l.startswith("@@ ")][-1][3:])
    if r["outcome"] == "error":
        what = f"{r['error']}: {r['message'][:70]}"
    elif r["outcome"] == "rc":
        what = f"rc={r['rc']} {r['output'].strip().splitlines()[-1][:70] if r['output'].strip() else ''}"
    else:
        what = "ok" + (f" verify ok={r['ok']}" if "ok" in r else "")
    return f"{what} | {r['ms']:.0f} ms | {r['rss_mib']:.0f} MiB"

tmpl = make_repo(W + "/tmpl", versions=3)

def fresh(name):
    p = f"{W}/{name}"
    shutil.copytree(tmpl, p)
    return p

def raw(root, v):
    b = manifest_body(root); b["tree"]["n"] = v
    return mf.MAGIC + msgpack.packb(b, use_bin_type=True)

def sparse(root, key, size):
    path = os.path.join(root, key)
    if os.path.lexists(path): os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f: f.truncate(size)

def fifo(root, key):
    path = os.path.join(root, key)
    if os.path.lexists(path): os.unlink(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mkfifo(path)

def keys(root, folder):
    out = []
    for d, _s, ns in os.walk(os.path.join(root, folder)):
        out += [os.path.relpath(os.path.join(d, n), root) for n in ns]
    return sorted(out)

cases = {}
def case(name):
    def deco(fn):
        cases[name] = fn
        return fn
    return deco

@case("baseline")
def _(r): return [("cli", "log"), ("load",), ("verify",)]

@case("nest200")
def _(r): commit_raw_manifest(r, raw(r, nested_tuples(200, "x"))); return [("cli", "log"), ("load",), ("verify",), ("resume",)]
@case("nest20000")
def _(r): commit_raw_manifest(r, raw(r, nested_tuples(20000, "x"))); return [("cli", "log"), ("load",), ("verify",)]
@case("nest120x4MiB")
def _(r): commit_raw_manifest(r, raw(r, nested_tuples(120, "x" * (4 << 20)))); return [("cli", "log"), ("load",)]
@case("nest300x4MiB")
def _(r): commit_raw_manifest(r, raw(r, nested_tuples(300, b"y" * (4 << 20)))); return [("cli", "log"), ("load",)]
@case("fifo_config")
def _(r): fifo(r, "config"); return [("cli", "log"), ("verify",)]
@case("fifo_manifest")
def _(r): fifo(r, "manifests/" + latest(r)); return [("cli", "log"), ("verify",), ("load",)]
@case("fifo_packs")
def _(r):
    for k in keys(r, "packs"): fifo(r, k)
    return [("verify",), ("load",), ("rebuild",)]
@case("fifo_stray_index")
def _(r): fifo(r, "index/" + "f" * 32); return [("cli", "log"), ("verify",)]
@case("fifo_locks_refs")
def _(r): fifo(r, "locks/refs"); return [("save",)]
@case("sparse_config_1G")
def _(r): sparse(r, "config", 1 << 30); return [("cli", "log")]
@case("sparse_config_1T")
def _(r): sparse(r, "config", 1 << 40); return [("cli", "log")]
@case("sparse_manifest_1G")
def _(r): sparse(r, "manifests/" + latest(r), 1 << 30); return [("load",), ("verify",)]
@case("sparse_index_1T")
def _(r): sparse(r, keys(r, "index")[0], 1 << 40); return [("verify",)]
@case("sparse_packs_1G")
def _(r):
    for k in keys(r, "packs"): sparse(r, k, 1 << 30)
    return [("verify",), ("load",), ("rebuild",)]
@case("sparse_packs_1T+1")
def _(r):
    for k in keys(r, "packs"): sparse(r, k, (1 << 40) + 1)
    return [("verify",), ("load",), ("rebuild",)]
@case("sparse_lock_1T_stale")
def _(r):
    sparse(r, "locks/refs", 1 << 40); os.utime(os.path.join(r, "locks/refs"), (1, 1)); return [("save",)]
@case("index_pack_newline")
def _(r):
    k = keys(r, "index")[0]
    pid, v = next(iter(index_fmt.decode(open(os.path.join(r, k), "rb").read()).items()))
    bad = index_fmt.encode({pid[:31] + "\n": v})
    open(os.path.join(r, "index", hex_id(bad)), "wb").write(bad)
    return [("cli", "log"), ("cli", "verify"), ("cli", "rebuild-index")]
@case("tag_newline")
def _(r): return [("cli", "tag", "v1\n")]

for name, fn in cases.items():
    if only and name not in only: continue
    r = fresh(name)
    for reader in fn(r):
        shown = " ".join(reader).encode("unicode_escape").decode()
        print(f"{name:22s} {shown:22s} {probe(reader[0], r, *reader[1:])}", flush=True)
    if name == "tag_newline":
        print(f"{name:22s} refs/tags now: {os.listdir(os.path.join(r, 'refs', 'tags')) if os.path.isdir(os.path.join(r, 'refs', 'tags')) else []}")
shutil.rmtree(W)
