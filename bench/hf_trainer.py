"""What a transformers Trainer writes per save: its own ``checkpoint-N`` folders, DeltackptTrainer's
versions, and ``deltackpt.save`` of the same state (the plain API), on the shipped MiniLM.

    PYTHONPATH=. python -m bench.hf_trainer --work /path/to/scratch [--steps 20 --save-steps 5]

Prints one JSON object: per save, the Trainer folder's bytes, the version's ``written_bytes`` and
the plain API's on the same state; the Trainer's output folder listing after the DeltackptTrainer
run; with ``save_total_limit=2``, what each retention gc did.  Bytes are counted (exact on any
machine); the seconds are wall time on whatever machine runs it (noisy on a shared one).
The work folder's contents are removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import deltackpt  # noqa: E402
from bench.workloads import minilm_dir  # noqa: E402
from deltackpt.integrations.hf import DeltackptTrainer, trainer as hf_trainer  # noqa: E402
from deltackpt.integrations.hf.layout import trainer_snapshot  # noqa: E402


def _data(tokenizer, n: int = 160, seq: int = 32) -> list[dict]:
    texts = [f"review {i}: the film was {'great fun' if i % 2 else 'a dull mess'} " * 3 for i in range(n)]
    enc = tokenizer(texts, padding="max_length", max_length=seq, truncation=True, return_tensors="pt")
    return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": i % 2}
            for i in range(n)]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForSequenceClassification.from_pretrained(minilm_dir(), num_labels=2)


def _args(out: str, steps: int, save_steps: int, **kw) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(output_dir=out, max_steps=steps, save_steps=save_steps, save_strategy="steps",
                                          per_device_train_batch_size=8, learning_rate=5e-5, report_to=[],
                                          use_cpu=True, logging_steps=save_steps, seed=0, disable_tqdm=True, **kw)


def _folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


class _Timed(transformers.TrainerCallback):
    """Seconds from the end of the step to the end of on_save: what a save held the loop."""

    def __init__(self) -> None:
        self.t0, self.seconds = 0.0, {}

    def on_step_end(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        self.seconds[state.global_step] = round(time.perf_counter() - self.t0, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--save-steps", type=int, default=5)
    a = ap.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    data = _data(tokenizer)
    result: dict = {"model": "all-MiniLM-L6-v2 + 2-class head", "steps": a.steps, "save_steps": a.save_steps,
                    "transformers": transformers.__version__}
    # the Trainer prints its logs on stdout, which is this program's JSON
    with contextlib.redirect_stdout(sys.stderr):
        _run(a, data, result)
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


def _run(a: argparse.Namespace, data: list[dict], result: dict) -> None:
    try:
        # 1. the Trainer's own checkpoints
        out = os.path.join(a.work, "hf-out")
        timed = _Timed()
        transformers.Trainer(model=_model(), args=_args(out, a.steps, a.save_steps), train_dataset=data,
                             callbacks=[timed]).train()
        folders = {int(d.split("-")[1]): _folder_bytes(os.path.join(out, d)) for d in os.listdir(out)
                   if d.startswith("checkpoint-")}
        result["trainer_folder_bytes"] = dict(sorted(folders.items()))
        result["trainer_folder_files"] = sorted(os.listdir(os.path.join(out, f"checkpoint-{a.save_steps}")))
        result["trainer_save_seconds"] = timed.seconds
        shutil.rmtree(out)

        # 2. DeltackptTrainer, and deltackpt.save of the same state into another repository
        out, repo, plain = (os.path.join(a.work, n) for n in ("dc-out", "dc-repo", "plain-repo"))

        class SaveAlike(transformers.TrainerCallback):
            def on_save(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
                deltackpt.save(trainer_snapshot(state, model, optimizer, lr_scheduler), plain, step=state.global_step)

        timed = _Timed()
        DeltackptTrainer(model=_model(), args=_args(out, a.steps, a.save_steps), train_dataset=data, repo=repo,
                         callbacks=[timed, SaveAlike()]).train()
        result["output_folder_after_run"] = sorted(os.listdir(out)) if os.path.isdir(out) else None
        result["version_written_bytes"] = {v.step: v.written_bytes for v in reversed(deltackpt.Repo(repo).log())}
        result["plain_save_written_bytes"] = {v.step: v.written_bytes for v in reversed(deltackpt.Repo(plain).log())}
        result["repository_bytes"] = deltackpt.Repo(repo).du()["total"]["stored_bytes"]
        result["deltackpt_save_seconds"] = timed.seconds   # its on_save runs before SaveAlike: ours alone
        for p in (out, repo, plain):
            shutil.rmtree(p, ignore_errors=True)

        # 3. save_total_limit=2: the retention gc after each save
        out, repo = os.path.join(a.work, "dc-out"), os.path.join(a.work, "dc-repo")
        reports = []
        real_gc = hf_trainer.gc

        def recorded_gc(*args, **kwargs):
            t0 = time.perf_counter()
            report = real_gc(*args, **kwargs)
            reports.append({"removed": len(report.removed), "reclaimed_bytes": report.reclaimed_bytes,
                            "chunks_rebased": report.chunks_rebased, "bases_kept": report.bases_kept,
                            "deltified_bytes": report.deltified_bytes, "seconds": round(time.perf_counter() - t0, 3)})
            return report

        hf_trainer.gc = recorded_gc
        try:
            DeltackptTrainer(model=_model(), args=_args(out, a.steps, a.save_steps, save_total_limit=2),
                             train_dataset=data, repo=repo).train()
        finally:
            hf_trainer.gc = real_gc
        result["limit2_gc"] = reports
        result["limit2_versions"] = [v.step for v in deltackpt.Repo(repo).log()]
        result["limit2_repository_bytes"] = deltackpt.Repo(repo).du()["total"]["stored_bytes"]
    finally:
        for name in ("hf-out", "dc-out", "dc-repo", "plain-repo"):
            shutil.rmtree(os.path.join(a.work, name), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
