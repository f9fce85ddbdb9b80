"""The process the reliability tests crash: it saves, tags or collects garbage and prints what it did.

Protocol on stdout (one line each, flushed):
    ATTEMPT <step> <digest>       before save(): the state it is about to save
    COMMITTED <version> <digest>  only after save() returned
    TAGGED <name> <version>       only after tag() returned
    GC <removed count>            only after gc() returned
    ERROR <type> <message>        a DeltackptError (or OSError) stopped the workload
    DONE

``digest`` is sha256 over the names and bytes of every tensor in the state (see ``state_digest``).

Two ways to run it:
    python child.py run '<json job>'      one job in this process
    python child.py serve                 a fork server: reads one JSON job per line on stdin,
                                          answers ``PID <rid> <pid>`` then ``EXIT <rid> <status>``;
                                          torch is imported once, each job runs in a fresh fork.
The fault hook (deltackpt/faults.py) is armed in the job's process from ``fault`` / ``trace``,
after ``arm_after`` saves (so a fault can target the second, incremental save).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import torch  # noqa: E402

import deltackpt  # noqa: E402
from deltackpt import faults  # noqa: E402
from deltackpt.errors import DeltackptError  # noqa: E402

CHUNK_BYTES = 16 << 10  # small chunks: a tiny model still spans many chunks and objects


def state_digest(state) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor in a nested state, in name order."""
    h = hashlib.sha256()
    items: list[tuple[str, torch.Tensor]] = []

    def walk(prefix: str, v) -> None:
        if isinstance(v, torch.Tensor):
            items.append((prefix, v))
        elif isinstance(v, dict):
            for k in v:
                walk(f"{prefix}/{k}", v[k])
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(f"{prefix}/{i}", x)

    walk("", state)
    for name, t in sorted(items, key=lambda x: x[0]):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:32]


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 32))


def train_state(step: int, seed: int = 0):
    """The deterministic training state after ``step`` Adam steps (recomputed, not restored)."""
    model = make_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for s in range(step):
        _train_step(model, opt, s, seed)
    return model, opt


def _train_step(model, opt, s: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed * 100003 + s)
    x = torch.randn(16, 32, generator=g)
    loss = ((model(x) - x) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def full_state(model, opt, step: int):
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}


def out(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def arm(job: dict) -> None:
    """Point the fault hook at this job's fault and trace file (what DELTACKPT_FAULT* would do)."""
    faults._SPEC = job.get("fault") or ""
    faults._TRACE = job.get("trace") or ""
    faults.ACTIVE = bool(faults._SPEC or faults._TRACE)
    faults._counts.clear()


def _save(repo, state, step: int, tag: str | None = None) -> str:
    d = state_digest(state)
    step += _OFFSET[0]
    out(f"ATTEMPT {step} {d}")
    v = deltackpt.save(state, repo, step=step, tag=tag)
    out(f"COMMITTED {v.id} {d}")
    return v.id


_OFFSET = [0]


def power_cut_job(path: str, cut: int | None, seed: int, revert_only: list | None = None) -> None:
    """Four saves, a deltification (older versions' keyframes re-stored as reverse deltas, packs
    dropped), a tag and a gc over the page-cache store; at the power cut the directory is rewritten
    as the cut left it and this process ends (as the machine would)."""
    import json
    import random

    from pagecache import PageCacheStore, PowerCut
    store = PageCacheStore(path, cut_at=cut)
    try:
        repo = deltackpt.Repo(store, create=True, chunk_bytes=CHUNK_BYTES)
        model, opt = train_state(0)
        for step in range(4):
            _train_step(model, opt, step, 0)
            _save(repo, full_state(model, opt, step), step)
        out("PHASE deltify")
        repo.deltify(lag=1)
        repo.tag("first", "latest~3")
        out("PHASE tagged")
        out(f"PHASE gc {store.steps}")
        repo.gc(keep_last=2, grace_seconds=0)
        out("PHASE gc-done")
        out(f"STEPS {store.steps}")
    except PowerCut:
        out("CRASH " + json.dumps(store.crash(random.Random(seed), tuple(revert_only) if revert_only is not None else None)))


def run_job(job: dict) -> None:
    torch.set_num_threads(1)
    _OFFSET[0] = int(job.get("offset", 0))  # step labels of concurrent writers must not collide
    repo = job["repo"]
    kind = job["workload"]
    seed = int(job.get("seed", 0))
    arm_after = int(job.get("arm_after", 0))
    saves = 0
    if arm_after == 0:
        arm(job)
    try:
        if kind != "powercut":
            deltackpt.Repo(repo, create=True, chunk_bytes=CHUNK_BYTES)
        if kind in ("save", "train"):
            start = int(job.get("start", 0))
            steps = int(job.get("steps", 1))
            if start > 0 and kind == "train":
                # resume like a real job: restore the newest version, then keep training
                model = make_model(seed)
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
                st = deltackpt.load(repo)
                model.load_state_dict(st["model"])
                opt.load_state_dict(st["optim"])
                start = int(st["step"])
            else:
                model, opt = train_state(start, seed)
            step = start
            for i in range(steps):
                if i > 0 or kind == "train":
                    _train_step(model, opt, step, seed)
                    step += 1
                _save(repo, full_state(model, opt, step), step, tag=job.get("tag") if i == steps - 1 else None)
                saves += 1
                if saves == arm_after:
                    arm(job)
                if job.get("sleep"):
                    time.sleep(float(job["sleep"]))
        elif kind == "tag":
            v = deltackpt.Repo(repo).tag(job["name"], job.get("version", "latest"))
            out(f"TAGGED {job['name']} {v.id}")
        elif kind == "gc":
            rep = deltackpt.gc(repo, keep_last=int(job.get("keep_last", 2)),
                               grace_seconds=float(job.get("grace", 0.0)))
            out(f"GC {len(rep.removed)}")
        elif kind == "deltify":
            rep = deltackpt.Repo(repo).deltify(lag=int(job.get("lag", 1)))
            out(f"DELTIFIED {rep.chunks}")
        elif kind == "powercut":
            power_cut_job(repo, job.get("cut"), int(job.get("seed", 0)), job.get("revert_only"))
        else:
            raise ValueError(f"unknown workload {kind!r}")
    except (DeltackptError, OSError) as exc:
        out(f"ERROR {type(exc).__name__} {str(exc)[:300].replace(chr(10), ' ')}")
        return
    out("DONE")


def _child(job: dict) -> int:
    fd = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = sys.stdout
    try:
        run_job(job)
        return 0
    except BaseException:
        traceback.print_exc()
        return 3


def _warm_up() -> None:
    """Run one save, load and gc here so the forks start with every lazy import done (the first
    save of a fresh interpreter costs seconds); one torch thread, and the save's pool is joined."""
    import io
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="deltackpt-warm-")
    real = sys.stdout
    sys.stdout = io.StringIO()
    try:
        run_job({"repo": os.path.join(d, "r"), "workload": "save", "steps": 2})
        deltackpt.load(os.path.join(d, "r"))
        deltackpt.gc(os.path.join(d, "r"), keep_last=1, grace_seconds=0)
        deltackpt.Repo(os.path.join(d, "r")).verify()
    finally:
        sys.stdout = real
        shutil.rmtree(d, ignore_errors=True)


def serve() -> None:
    """Fork server: one job per stdin line; torch stays imported so a job starts in milliseconds."""
    _warm_up()
    running: dict[int, str] = {}
    buf = b""
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    eof = False
    while not eof or running:
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            rid = running.pop(pid, None)
            if rid is not None:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                sys.stdout.write(f"EXIT {rid} {code}\n")
                sys.stdout.flush()
        if eof:
            time.sleep(0.01)
            continue
        ready, _, _ = select.select([stdin], [], [], 0.01)
        if not ready:
            continue
        data = os.read(stdin.fileno(), 65536)
        if not data:
            eof = True
            continue
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            job = json.loads(line)
            pid = os.fork()
            if pid == 0:
                code = 3
                try:
                    os.setpgid(0, 0)
                    code = _child(job)
                finally:
                    os._exit(code)
            running[pid] = job["rid"]
            sys.stdout.write(f"PID {job['rid']} {pid}\n")
            sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        job = json.loads(sys.argv[2])
        sys.exit(_child(job) if "out" in job else (run_job(job) or 0))
