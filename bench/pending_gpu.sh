#!/usr/bin/env bash
# What was built and checked on the CPU but not yet measured on a GPU, as device calls of under ten
# minutes each. Each step has its own time limit and writes under $OUT/<step>; a step that fails or
# times out is said in $OUT/steps.txt and the next one runs. (Session 56 ran the earlier a-d on an
# H100: bench/results/h100_2026-12-05/.)
#
#     bash bench/pending_gpu.sh a    # session 56: packed prefill given as offsets after the stored-document
#                                    # fix (22.3 ms before it, document ids 3.2), and the host time of new
#                                    # lengths (its step had timed out at 100 s: now one op, 250 s)
#     bash bench/pending_gpu.sh b    # sweep 4's rows not run yet (norms, MoE)
#     bash bench/pending_gpu.sh d    # session 63: plain products as the vendor's GEMM (lower/library.py)
#                                    # against the generated GEMM and the peers, forward and fwd+bwd; then
#                                    # bench/beyond's norm -> matmul rows (tuned) and linear CE's training
#     bash bench/pending_gpu.sh f    # session 63, not run: split-K combines unrolled (decode operators and
#                                    # RMSNorm -> matmul's training, unroll 1 against 8), then the library
#                                    # GEMM's training rows again (the weight gradient's copy removed)
#     bash bench/pending_gpu.sh g    # session 64: cosine retrieval after its fp16 operands reach the tensor
#                                    # cores (213.6 ms before), then sweep 5's rows the session had no time for
#     bash bench/pending_gpu.sh h    # session 66 ran it (bench/results/h100_2026-12-06/s66/); not yet measured:
#                                    # CLIP's loss with its logits in a TF32x3 GEMM (the TF32 rates by layout came
#                                    # after): the fp32_rows step alone
#     bash bench/pending_gpu.sh i    # session 67: where sweep 5's two slow training rows spend their time (native
#                                    # F.rms_norm -> matmul 0.55x eager, triplet margin 0.73x), then h's CLIP row
#     bash bench/pending_gpu.sh j    # session 69: library-GEMM plans bound (their CUDA tests, the host time of
#                                    # RMSNorm -> matmul's step: 937 us before); the folded norm backward's
#                                    # chunk counts again, the step against torch.compile; the plain norms' parts
#     bash bench/pending_gpu.sh k    # session 70 (run in session 71: bench/results/h100_2026-12-07/s71/pending_k/):
#                                    # dynamic row lengths after their maps split into whole
#                                    # tiles and a tail and resident rows priced scalar (softmax 3.3x static before),
#                                    # linear CE's training beside torch.compile, the ten operators' dynamic rows,
#                                    # the MoE router losses' joint training (the one sweep row that picks it)
#     bash bench/pending_gpu.sh l    # session 71, not run: CosFace's backward alternatives (its float64 reference
#                                    # built since), the gated attention's kernels beside torch.compile's, then
#                                    # sweep 6 whole after every change of the session
#     bash bench/pending_gpu.sh m    # session 72 ran it (bench/results/h100_2026-12-07/s72/pending_m/, with
#                                    # index_add_ as the scatter): sweep 7, CosFace's step, SwiGLU's training
#     bash bench/pending_gpu.sh n    # session 72: CosFace's, SwiGLU's and the gated attention's kernels beside
#                                    # torch.compile's
#     bash bench/pending_gpu.sh q    # session 74: ties found against a min recomputed in other kernels (short
#                                    # reductions written out, no FMA contraction) on CUDA; Chamfer's rows and
#                                    # linear attention's training (float32 operands) re-measured
#     bash bench/pending_gpu.sh r    # session 75 (run in session 76: bench/results/h100_2026-12-07/s76/, its --contract
#                                    # step timed out at 60 s): a min recomputed in other kernels on CUDA — the CUDA
#                                    # test, bench/probe_fma_exact.py — then q's exactness probe and linear attention
#     bash bench/pending_gpu.sh s    # session 76 ran it (bench/results/h100_2026-12-07/s76/): compared maxes spelled
#                                    # alike, buffer-read mins exact, bf16 ties against float32, linear attention trains
#     bash bench/pending_gpu.sh t    # session 76, not run: linear attention's training after its combine tiles j
#     bash bench/pending_gpu.sh u    # session 77: t, then the gated attention's kernels beside torch.compile's
#     bash bench/pending_gpu.sh o    # session 72, not run: sweep 7 again with the scatter as a Triton kernel of
#                                    # atomic adds (lower/scatter_rows.py: run in the interpreter only) and rows
#                                    # read once per point sharing them (bag classifier 12.09 ms before), the
#                                    # bag classifier's kernels, then sweep 6 whole (an MoE router's training
#                                    # had raised IndexError in a first version of the transposing map)
#     bash bench/pending_gpu.sh p    # session 73, not run: linear attention's training after its key gradient's
#                                    # two parts are summed in float32 (failed the float64 check before: 4.3e-3),
#                                    # then sweep 8's rows again (o's sweep 6 step was never run either)
#     bash bench/pending_gpu.sh c    # session 60: the folded norm backwards (extract/fold_rows.py) in the
#                                    # sweep's norm rows beside their peers, and the probe's folded/unfolded
#                                    # pairs again
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
    step packed_offsets 240 python3 bench/varlen_paged.py --only prefill --out "$OUT/packed_offsets/rows.json"
    step new_lengths 250 python3 bench/dynamic_lengths.py --ops gqa_pf --L 12000 --new-lengths 40 \
      --out "$OUT/new_lengths/rows.json"
    step cuda_tests 100 python3 -m pytest -q tests/test_gpu_hardening.py tests/test_bound_call.py
    ;;
  b)
    step sweep4_rest 500 python3 bench/sweep_fourth.py --only weight_standardize inf_norm logsumexp_two_dims \
      scalar_temperature moe_aux moe_router --out "$OUT/sweep4_rest/rows.json"
    ;;
  c)
    step fold_rows 200 python3 bench/probe_fold_rows.py
    step norm_rows 350 python3 bench/sweep_fourth.py --only gemma_rms_norm layer_norm_plain channels_layer_norm \
      var_mean_standardize --out "$OUT/norm_rows/rows.json"
    ;;
  d)
    step library_probe 330 python3 bench/probe_library_gemm.py --out "$OUT/library_probe/rows.json"
    step beyond_norm 260 python3 bench/beyond/run.py --programs rmsnorm_matmul layernorm_matmul --alternatives 3 \
      --out "$OUT/beyond_norm" --cache-dir /tmp/nc
    ;;
  e)
    step lce_train 560 python3 bench/grad_memory.py --only linear_ce --out "$OUT/lce_train/rows.json"
    ;;
  f)
    step combine_unroll 200 python3 bench/probe_combine_unroll.py --out "$OUT/combine_unroll/rows.json"
    step library_train 200 python3 bench/probe_library_gemm.py --only rms_train ln_train --rounds 5 \
      --out "$OUT/library_train/rows.json"
    ;;
  g)
    step sweep5_fix 200 python3 bench/probe_sweep5_fix.py --only cosine_retrieval
    step sweep5_rest 500 python3 bench/sweep_fifth.py --only poisson multilabel bce l1_loss pairwise nll_weight \
      entropy frobenius std_standardise sdpa --out "$OUT/sweep5_rest/rows.json"
    ;;
  j)
    step cuda_tests 200 python3 -m pytest -q tests/test_bound_call.py tests/test_library_gemm.py
    step step_host 90 python3 bench/probe_step_host.py "native_rms_norm_matmul fwd+bwd 4096x4096->4096 bf16"
    step map_backward 200 python3 bench/probe_backward_parts.py "native_rms_norm_matmul fwd+bwd 4096x4096->4096 bf16" \
      --only _operands --alternatives 8 --kernels
    step rms_mm_step 150 python3 bench/probe_sweep_kernels.py "native_rms_norm_matmul fwd+bwd" --alternatives 0 --compile
    step norm_parts 240 python3 bench/probe_backward_parts.py "rms_norm fwd+bwd 16384x4096 bf16" \
      "gemma_rms_norm fwd+bwd 16384x2304 bf16" --alternatives 6 --kernels
    ;;
  k)
    step dynamic_rows 200 python3 bench/probe_dynamic_vectorise.py --lengths 8192 5008 5000 3000
    step lce 250 python3 bench/grad_memory.py --only linear_ce --impls neptune_eq compile --out "$OUT/lce/rows.json"
    step new_lengths 250 python3 bench/dynamic_lengths.py --ops gqa_pf window_pf softcap_pf --L 3000 12000 \
      --out "$OUT/new_lengths/rows.json"
    step moe_joint 150 python3 bench/probe_sweep_kernels.py "moe_router_losses fwd+bwd" --alternatives 0 --compile
    ;;
  m)
    step sweep7 240 python3 bench/sweep_seventh.py --out "$OUT/sweep7/rows.json"
    step cosface 120 python3 bench/sweep_sixth.py --only cosface --out "$OUT/cosface/rows.json"
    step swiglu 150 python3 bench/sweep_sixth.py --only "swiglu_mlp fwd+bwd" --out "$OUT/swiglu/rows.json"
    ;;
  o)
    step sweep7 200 python3 bench/sweep_seventh.py --out "$OUT/sweep7/rows.json"
    step bag_kernels 100 python3 bench/probe_sweep_kernels.py "bag_classifier fwd+bwd" "center_loss fwd+bwd" \
      --alternatives 0 --compile
    step sweep6 280 python3 bench/sweep_sixth.py --out "$OUT/sweep6/rows.json"
    ;;
  p)
    step linattn 150 python3 bench/sweep_eighth.py --only linear_attention --out "$OUT/linattn/rows.json"
    step sweep8 300 python3 bench/sweep_eighth.py --out "$OUT/sweep8/rows.json"
    ;;
  q)
    # session 74: short reductions written out per coordinate in kernels without FMA contraction, so a
    # distance compared with its min recomputed elsewhere finds its ties (Chamfer's training then need not
    # write its distances); float32 operands beside 16-bit loads multiplied in float32 (linear attention)
    step exact 200 python3 bench/probe_exact_recompute.py
    step chamfer 200 python3 bench/sweep_eighth.py --only chamfer --out "$OUT/chamfer/rows.json"
    step linattn 150 python3 bench/sweep_eighth.py --only linear_attention --out "$OUT/linattn/rows.json"
    step chamfer_kernels 120 python3 bench/probe_sweep_kernels.py "chamfer fwd+bwd" --alternatives 0 --compile \
      --explain
    ;;
  r)
    step fma_test 100 python3 -m pytest -q -x tests/test_gpu_hardening.py -k "recomputed or integers or float64"
    step fma_exact 60 python3 bench/probe_fma_exact.py
    XDG_CACHE_HOME=/tmp/xdg_contract step fma_contract 60 python3 bench/probe_fma_exact.py --contract
    step exact 150 python3 bench/probe_exact_recompute.py
    step linattn 150 python3 bench/sweep_eighth.py --only linear_attention --out "$OUT/linattn/rows.json"
    ;;
  s)
    # session 76: a compared max's value spelled as its pass reduces it, and kernels reading a compared min
    # from a buffer compiled without FMA contraction (probe_fma_exact: 10-150 rows off before); the probe's
    # bf16 ties against torch in float32; linear attention's training (OutOfResources before: the smem model
    # now counts float32 dot operands computed or widened per step)
    step fma_exact 100 python3 bench/probe_fma_exact.py
    step cuda_tests 150 python3 -m pytest -q -x tests/test_gpu_hardening.py -k "recomputed or layer_norm"
    step exact 120 python3 bench/probe_exact_recompute.py --ties-only
    step linattn 150 python3 bench/sweep_eighth.py --only linear_attention --out "$OUT/linattn/rows.json"
    ;;
  t)
    # session 76, not run (no device time left): linear attention's training after its key-gradient combine
    # tiles j (one key a program before: 223.6 us), its kernels, and the K-loop probe with its finite check
    step linattn 100 python3 bench/sweep_eighth.py --only linear_attention --out "$OUT/linattn/rows.json"
    step linattn_kernels 120 python3 bench/probe_sweep_kernels.py "linear_attention fwd+bwd" --alternatives 0 --compile
    step kloop 100 python3 bench/probe_ieee_kloop.py
    ;;
  u)
    # session 77: t (not run in session 76, and every start of session 77's first 25 minutes failed), then
    # the gated attention's kernels beside torch.compile's (0.60x; session 72's n never ran)
    step linattn 100 python3 bench/sweep_eighth.py --only linear_attention --out "$OUT/linattn/rows.json"
    step linattn_kernels 120 python3 bench/probe_sweep_kernels.py "linear_attention fwd+bwd" --alternatives 0 --compile
    step kloop 100 python3 bench/probe_ieee_kloop.py
    step gated_kernels 150 python3 bench/probe_sweep_kernels.py "gated_sdpa fwd+bwd" --alternatives 0 --compile
    ;;
  n)
    step cosface_kernels 120 python3 bench/probe_sweep_kernels.py "cosface fwd+bwd" --alternatives 0 --compile
    step swiglu_kernels 150 python3 bench/probe_sweep_kernels.py "swiglu_mlp fwd+bwd" --alternatives 0 --compile
    step gated_kernels 120 python3 bench/probe_sweep_kernels.py "gated_sdpa fwd+bwd" --alternatives 0 --compile
    ;;
  l)
    step cosface_parts 200 python3 bench/probe_backward_parts.py "cosface fwd+bwd" --alternatives 6 --kernels
    step gated_kernels 120 python3 bench/probe_sweep_kernels.py "gated_sdpa fwd+bwd" --alternatives 0 --compile
    step sweep6 260 python3 bench/sweep_sixth.py --out "$OUT/sweep6/rows.json"
    ;;
  i)
    step sweep5_kernels 300 python3 bench/probe_sweep_kernels.py "native_rms_norm_matmul fwd+bwd" "triplet_margin fwd+bwd" \
      --compile --explain
    step fp32_rows 200 python3 bench/sweep_fifth.py --only clip cosine --out "$OUT/fp32_rows/rows.json"
    ;;
  h)
    step fp32_fused 250 python3 bench/probe_fp32_fused.py --out "$OUT/fp32_fused/rows.json"
    step fp32_rows 200 python3 bench/sweep_fifth.py --only clip cosine --out "$OUT/fp32_rows/rows.json"
    ;;
  *)
    echo "usage: bash bench/pending_gpu.sh a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p|q|r|s|t" >&2
    exit 2
    ;;
esac
cat "$OUT/steps.txt"
