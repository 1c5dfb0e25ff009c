#!/usr/bin/env bash
# The GPU checks as one prepared script, for a machine with one CUDA GPU and no network (an H200 here).
# Run from the repository root, with .whl/ holding slurmkit's wheel and the light dependencies that
# machine lacks (benchmarks/README.md says how they were made); results go to $OUT.
#   1. tests/unit/test_gpu_device.py: pinned staging, nvidia-smi/NVML against torch, NCCL + bf16 under the Trainer
#   2. benchmarks/bench_gpu.py: MFU of the GPT example (DDP, FSDP2; eager and compiled) at a size that
#      fills the device, against the bf16 matmul measured first, and the async-save stall against DCP's
#   3. the product path: `slurmkit submit` of examples/train_gpt.yaml on the local profile, one rank on
#      NCCL, with the GPU sampler on; its summary, GPU samples and report come back
# GPU_CHECK_CPU=1: the same three steps on this CPU machine, at a toy size, with the python on PATH
# (the project's environment): the script itself checked where no GPU is lent.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
repo=$(pwd)
if [ "${GPU_CHECK_CPU:-0}" = 1 ]; then
  py=python
  bench=(--steps 20 --every 10 --layers 2 --d-model 64 --heads 2 --seq 32 --batch 4 --vocab 256 --cpu)
  model=(--set config.steps=20 --set config.n_layer=2 --set config.d_model=64 --set config.n_head=2
         --set config.seq_len=32 --set config.vocab_size=256 --set config.batch_size=4 --set config.dataset_size=64
         --set config.log_every=5 --set config.checkpoint_every=10)
else
  py=python3
  bench=(--steps 100 --every 50 --layers 24 --d-model 2048 --heads 16 --seq 2048 --batch 8)
  model=(--set resources.gpus_per_node=1 --set config.steps=200 --set config.n_layer=12 --set config.d_model=1024
         --set config.n_head=16 --set config.seq_len=1024 --set config.vocab_size=32000 --set config.batch_size=16
         --set config.dataset_size=1024 --set config.log_every=20 --set config.checkpoint_every=100)
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
export PYTHONUNBUFFERED=1
"$py" -c 'import torch, slurmkit; print("torch", torch.__version__, "cuda", torch.version.cuda, "slurmkit", slurmkit.__file__)'

echo "== 1. tests/unit/test_gpu_device.py"
timeout 150 "$py" -P -m pytest -q -p no:cacheprovider tests/unit/test_gpu_device.py 2>&1 | tee "$OUT/tests.log" | tail -25

# On the GPU: ~1.2 B parameters (24 x 2048, seq 2048, batch 8: about 50 GB).
echo "== 2. benchmarks/bench_gpu.py ${bench[*]}: DDP and FSDP2, eager and compiled"
# MFU over the datasheet's bf16 peak: slurmkit.worker.train.flops has one for each of H100 SXM, PCIe and NVL,
# H200 (and GH200), A100, L40S and B200; another GPU is measured against A100's and says so.
timeout 420 "$py" -P benchmarks/bench_gpu.py "${bench[@]}" --compile both --dir /tmp 2>&1 | tee "$OUT/bench.log" | grep -v '^step \|committed'

echo "== 3. slurmkit submit on the local profile, one rank, NCCL"
cd /tmp || exit 1
timeout 120 "$py" -P -m slurmkit submit "$repo/examples/train_gpt.yaml" --set resources.tasks_per_node=1 \
  "${model[@]}" --set config.gpu_sample_s=1 --wait 2>&1 | tee "$OUT/submit.log"
run=$(awk '$1 == "run" {print $NF; exit}' "$OUT/submit.log")
cp "$run"/metrics-gpu-*.jsonl "$OUT/" 2>/dev/null
grep -ho 'backend=[a-z]*' "$run"/submitit/*_log.out "$OUT/submit.log" 2>/dev/null | sort | uniq -c
"$py" - "$OUT" <<'PY'
import glob, json, sys
samples = [json.loads(line) for f in glob.glob(sys.argv[1] + "/metrics-gpu-*.jsonl") for line in open(f) if line.strip()]
print("GPU samples:", len(samples), "first:", samples[0] if samples else None, "last:", samples[-1] if samples else None)
PY
"$py" -P -m slurmkit result "$run" --json > "$OUT/result.json"
"$py" -P -m slurmkit report "$run" -o "$OUT/report.png" 2>&1 | tail -2
ls "$run" > "$OUT/run_files.txt"
echo "== done"
