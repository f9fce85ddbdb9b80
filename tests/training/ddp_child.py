"""One rank of a 2-rank DDP training run with a divergence guard (tests/training/test_guard_ddp.py).

    python -m tests.training.ddp_child RANK STORE REPO OUT [FAULT_RANK]

The ranks meet through a FileStore at STORE (gloo on CPU), train the MLP of ``_guarded.py`` under
DistributedDataParallel, each on its own batches, and save through a Checkpointer on rank 0 only
(``writes=(rank == 0)``).  At step 23 the batch of rank FAULT_RANK (default 1) arrives with its
targets scaled by 30, once: only that rank's loss spikes.  OUT receives, as JSON, the rollbacks
this rank did and a hash of its final weights.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist

from deltackpt.training import Checkpointer, Guard, training_state
from deltackpt.training.policies import EveryN
from tests.training._guarded import Dense, data

STEPS, FAULT_AT = 40, 23


def main(rank: int, store_path: str, repo: str, out: str, fault_rank: int = 1) -> None:
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        model = Dense()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        x, y, _ = data(rank).tensors                 # each rank its own shard
        g = torch.Generator().manual_seed(rank)
        batches = [torch.randint(0, len(x), (8,), generator=g) for _ in range(STEPS + 1)]
        guard = Guard(model=model, optimizer=opt)
        ckpt = Checkpointer(repo, EveryN(5), guard=guard, blocking=True, writes=rank == 0)
        step, faulted, done = 0, False, []
        while step < STEPS:
            idx = batches[step]
            target = y[idx]
            if step + 1 == FAULT_AT and rank == fault_rank and not faulted:
                target, faulted = target * 30.0, True
            loss = torch.nn.functional.mse_loss(ddp(x[idx], idx), target)
            opt.zero_grad()
            loss.backward()                             # gradients all-reduced: both replicas move
            opt.step()
            step += 1
            ckpt.step(lambda: training_state(model=model, optimizer=opt, step=step), step=step,
                      metrics={"loss": loss.item()})
            rb = ckpt.rollback
            if rb is not None:
                done.append({"from_step": rb.from_step, "bad_start": rb.bad_start, "step": rb.step,
                             "version": rb.version.id, "seen_on": rb.seen_on, "rule": rb.verdict.rule,
                             "committed": rb.committed.id if rb.committed else None, "event": rb.event,
                             "message": rb.message})
                step = rb.step
        ckpt.close()
        digest = hashlib.sha256()
        for name, t in sorted(model.state_dict().items()):
            digest.update(name.encode() + t.detach().contiguous().numpy().tobytes())
        with open(out + ".tmp", "w") as f:
            json.dump({"rank": rank, "rollbacks": done, "weights": digest.hexdigest(), "step": step}, f)
        os.replace(out + ".tmp", out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], *(int(a) for a in sys.argv[5:6]))
