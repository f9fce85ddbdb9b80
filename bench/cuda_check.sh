#!/usr/bin/env bash
# The checks that need a GPU, as one script (issue 32, item 6), under 8 minutes on one H100/H200:
#   1. the CUDA tests (lazy snapshot ordering, GPU save/restore, restore through pinned windows);
#   2. python -m bench cuda_checkpoint: GPT-2 small + AdamW on the GPU, save stall and restore
#      into device memory against torch.save/torch.load and DCP async_save (bench/CUDA.md);
#   3. python -m bench load_speed on gpt2: the newest version restored to the CPU by a fresh
#      process, warm and cold, on every core of a GPU node's host.
# Run from the repository root with deltackpt's dependencies importable.  Logs and JSON go to
# $OUT (default: a new temp folder, printed).  The exit status is the first step's that failed.
set -uo pipefail
out=${OUT:-$(mktemp -d)}
echo "results in $out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
  "$py" -c "import torch, deltackpt; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'deltackpt', deltackpt.__version__)"
} 2>&1 | tee "$out/machine.txt"
timeout 150 "$py" -m pytest -q -p no:cacheprovider tests/snapshot/test_lazy_cuda.py tests/api/test_device_restore.py \
    tests/scale/test_large_state.py 2>&1 | tee "$out/cuda_tests.log"
rc=$?
timeout 260 "$py" -m bench cuda_checkpoint --rounds 3 --steps 20 --json "$out/cuda_checkpoint.json" 2>&1 \
    | tee "$out/cuda_checkpoint.log"
step=$?; [ $rc -eq 0 ] && rc=$step
timeout 130 "$py" -m bench load_speed --workloads gpt2 --rounds 1 --json "$out/load_speed.json" 2>&1 \
    | tee "$out/load_speed.log"
step=$?; [ $rc -eq 0 ] && rc=$step
exit $rc
