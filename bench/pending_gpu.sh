#!/usr/bin/env bash
# What was built and checked on the CPU but never run on a GPU (sessions 50–52 had little or no device
# time), as three device calls of under ten minutes each. Each step has its own time limit and writes
# under $OUT/<step>; a step that fails or times out is said in $OUT/steps.txt and the next one runs.
#
#     bash bench/pending_gpu.sh a    # training steps at new lengths after session 54's fixes, their probe, CUDA tests
#     bash bench/pending_gpu.sh b    # the prefill and decode operators at lengths never compiled: kernels against a
#                                    # static compile, and the host time of new lengths (issue 14's targets)
#     bash bench/pending_gpu.sh c    # sweep 4's rows not run yet (attention after block-local, norms, MoE)
#     bash bench/pending_gpu.sh d    # session 55: packed prefill given as offsets (cu_seqlens) beside document
#                                    # ids, Flex and padded SDPA; decode with dynamic=True (batch, heads and keys
#                                    # dynamic: plans per range now); the CUDA tests of the session's fixes
#
# On the device machine (task text): carry .whl, then
#     python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
#       && export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-deps --no-build-isolation -e . \
#       && bash bench/pending_gpu.sh a
set -u
OUT=${OUT:-/tmp/pending_gpu}
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$OUT/device.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  mkdir -p "$OUT/$name"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name/log.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc ${limit}s-limit $((SECONDS - t0))s: $*" >> "$OUT/steps.txt"
}

case "${1:-}" in
  a)
    step dynamic_training 280 python3 bench/dynamic_training.py --out "$OUT/dynamic_training/rows.json"
    step probe_step 110 python3 bench/probe_dynamic_step.py causal_attention:3000 causal_lm_loss:1500
    step cuda_tests 100 python3 -m pytest -q tests/test_gpu_hardening.py tests/test_bound_call.py  # (CUDA-only files)
    step cuda_marked 60 python3 -m pytest -q tests/test_frontend_safety.py -k "replay or dynamic_functions_training"
    ;;
  b)
    step dynamic_lengths 420 python3 bench/dynamic_lengths.py --ops causal_pf gqa_pf window_pf softcap_pf \
      causal_dc gqa_dc --L 3000 12000 --out "$OUT/dynamic_lengths/rows.json"
    step new_lengths 100 python3 bench/dynamic_lengths.py --ops gqa_pf window_pf --L 12000 --new-lengths 40 \
      --out "$OUT/new_lengths/rows.json"
    ;;
  c)
    step sweep4_rest 500 python3 bench/sweep_fourth.py --only block_local sliding_gqa ssmax softmax_one \
      head_temperature additive_mask packed_sdpa layer_norm_plain var_mean gemma_rms weight_standardize \
      inf_norm logsumexp_two_dims scalar_temperature moe_aux moe_router --out "$OUT/sweep4_rest/rows.json"
    ;;
  d)
    step packed_offsets 240 python3 bench/varlen_paged.py --only prefill --out "$OUT/packed_offsets/rows.json"
    step decode_dynamic 240 python3 bench/dynamic_lengths.py --ops causal_dc gqa_dc softcap_dc --L 3000 12000 \
      --out "$OUT/decode_dynamic/rows.json"
    step cuda_tests 100 python3 -m pytest -q tests/test_gpu_hardening.py tests/test_bound_call.py
    ;;
  *)
    echo "usage: bash bench/pending_gpu.sh a|b|c|d" >&2
    exit 2
    ;;
esac
cat "$OUT/steps.txt"
