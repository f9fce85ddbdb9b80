"""What a transformers Trainer writes per save: its own ``checkpoint-N`` folders, DeltackptTrainer's
versions, and ``deltackpt.save`` of the same state (the plain API), on the shipped MiniLM (quick: a
2-layer BERT of the same config, random weights).

    python -m bench trainer_checkpoints [--steps 20 --save-steps 5]

Prints one JSON object: per save, the Trainer folder's bytes, the version's ``written_bytes`` and
the plain API's on the same state; the Trainer's output folder listing after the DeltackptTrainer
run (no ``checkpoint-*``); with ``save_total_limit=2``, the versions kept and the repository's
size.  Bytes are counted (exact on any machine); the seconds are wall time on whatever machine runs
it.  The quick run asserts that the version and the plain save wrote the same bytes, that no
checkpoint folder was written, and that the last version loads bit for bit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

from bench.common.scratch import scratch
from bench.common.workloads import TINY_BERT, minilm_dir

SUMMARY = "a transformers Trainer's checkpoint folders against DeltackptTrainer's versions and the plain API, bytes per save"
WRITES = "stdout (JSON)"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 20, quick 4)")
    ap.add_argument("--save-steps", type=int, default=None, help="steps between saves (default 5, quick 2)")


def _model(quick: bool) -> torch.nn.Module:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers
    torch.manual_seed(0)
    if quick:
        cfg = transformers.BertConfig.from_pretrained(minilm_dir(), num_labels=2, **TINY_BERT)
        return transformers.BertForSequenceClassification(cfg)
    return transformers.AutoModelForSequenceClassification.from_pretrained(minilm_dir(), num_labels=2)


def _data(quick: bool, n: int = 160, seq: int = 32) -> list[dict]:
    import transformers
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    texts = [f"review {i}: the film was {'great fun' if i % 2 else 'a dull mess'} " * 3 for i in range(n)]
    enc = tokenizer(texts, padding="max_length", max_length=seq, truncation=True, return_tensors="pt")
    vocab = TINY_BERT["vocab_size"] if quick else None
    ids = enc["input_ids"] % vocab if vocab else enc["input_ids"]
    return [{"input_ids": ids[i], "attention_mask": enc["attention_mask"][i], "labels": i % 2} for i in range(n)]


def _args(out: str, steps: int, save_steps: int, **kw):
    import transformers
    return transformers.TrainingArguments(output_dir=out, max_steps=steps, save_steps=save_steps, save_strategy="steps",
                                          per_device_train_batch_size=8, learning_rate=5e-5, report_to=[],
                                          use_cpu=True, logging_steps=save_steps, seed=0, disable_tqdm=True, **kw)


def _folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def run(args: argparse.Namespace) -> int:
    import transformers
    transformers.logging.set_verbosity_error()
    steps = args.steps or (4 if args.quick else 20)
    every = args.save_steps or (2 if args.quick else 5)
    data = _data(args.quick)
    result: dict = {"model": "tiny BERT" if args.quick else "all-MiniLM-L6-v2 + 2-class head", "steps": steps,
                    "save_steps": every, "transformers": transformers.__version__}
    with scratch("bench-trainer-", parent=args.tmp) as work:
        # the Trainer prints its logs on stdout, which is this program's JSON
        with contextlib.redirect_stdout(sys.stderr):
            _run(args.quick, work, steps, every, data, result)
    json.dump(result, sys.stdout, indent=1)
    print()
    if args.quick:
        assert result["version_written_bytes"] == result["plain_save_written_bytes"], result
        assert not [n for n in result["output_folder_after_run"] or [] if n.startswith("checkpoint-")], result
        assert result["last_version_bit_identical"], result
    return 0


def _run(quick: bool, work: str, steps: int, every: int, data: list[dict], result: dict) -> None:
    import transformers

    import deltackpt
    from deltackpt.integrations.hf import DeltackptTrainer
    from deltackpt.integrations.hf.layout import trainer_snapshot

    class Timed(transformers.TrainerCallback):
        """Seconds from the end of the step to the end of on_save: what a save held the loop."""

        def __init__(self) -> None:
            self.t0, self.seconds = 0.0, {}

        def on_step_end(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_save(self, args, state, control, **kwargs):
            self.seconds[state.global_step] = round(time.perf_counter() - self.t0, 3)

    # 1. the Trainer's own checkpoints
    out = os.path.join(work, "hf-out")
    timed = Timed()
    transformers.Trainer(model=_model(quick), args=_args(out, steps, every), train_dataset=data, callbacks=[timed]).train()
    folders = {int(d.split("-")[1]): _folder_bytes(os.path.join(out, d)) for d in os.listdir(out) if d.startswith("checkpoint-")}
    result["trainer_folder_bytes"] = dict(sorted(folders.items()))
    result["trainer_save_seconds"] = timed.seconds

    # 2. DeltackptTrainer, and deltackpt.save of the same state into another repository
    out, repo, plain = (os.path.join(work, n) for n in ("dc-out", "dc-repo", "plain-repo"))
    snapshots: dict[int, dict] = {}

    class SaveAlike(transformers.TrainerCallback):
        def on_save(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
            snap = trainer_snapshot(state, model, optimizer, lr_scheduler)
            deltackpt.save(snap, plain, step=state.global_step)
            snapshots[state.global_step] = {k: v.clone() for k, v in model.state_dict().items()}

    timed = Timed()
    DeltackptTrainer(model=_model(quick), args=_args(out, steps, every), train_dataset=data, repo=repo,
                     callbacks=[timed, SaveAlike()]).train()
    result["output_folder_after_run"] = sorted(os.listdir(out)) if os.path.isdir(out) else None
    with deltackpt.Repo(repo) as r, deltackpt.Repo(plain) as p:
        result["version_written_bytes"] = {v.step: v.written_bytes for v in reversed(r.log())}
        result["plain_save_written_bytes"] = {v.step: v.written_bytes for v in reversed(p.log())}
        result["repository_bytes"] = r.du()["total"]["stored_bytes"]
        last = r.load("latest")["model"]
        result["last_version_bit_identical"] = all(torch.equal(last[k], t) for k, t in snapshots[max(snapshots)].items())
    result["deltackpt_save_seconds"] = timed.seconds   # its on_save runs before SaveAlike: ours alone

    # 3. save_total_limit=2: the retention gc after each save
    out, repo = os.path.join(work, "limit-out"), os.path.join(work, "limit-repo")
    DeltackptTrainer(model=_model(quick), args=_args(out, steps, every, save_total_limit=2), train_dataset=data,
                     repo=repo).train()
    with deltackpt.Repo(repo) as r:
        result["limit2_versions"] = [v.step for v in r.log()]
        result["limit2_repository_bytes"] = r.du()["total"]["stored_bytes"]
