"""Issue 14, items 2-3: packed variable-length prefill and paged-KV decode, written in plain PyTorch
and compiled by neptune_eq, against the peers a user would call — each checked against float64
first, all timed in one process (medians of triton.testing.do_bench).

    python bench/varlen_paged.py --out varlen_paged.json            # both benchmarks
    python bench/varlen_paged.py --only paged --pages 16 64

Packed prefill: documents of random lengths packed along one axis of q, k, v [H, T, D], causal
within each document (a document-id mask, bounds worked out per call from the ids). Peers:
FlexAttention with a document BlockMask (built once, outside the timing, as it is meant to be
used) and SDPA (is_causal) on the batch padded to the longest document.

Paged decode: one query per request and head, the KV cache in pages `k_cache[block_table[b, j // P],
j % P]`, per-request lengths. Peers: SDPA on the KV gathered to a contiguous padded batch (with the
gather timed, and without it), FlexAttention on that gathered batch with a length BlockMask. The
ceiling: a device copy of the bytes the kernel must read.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import torch
import torch.nn.functional as F


def varlen_attention(q, k, v, doc):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[1], device=q.device)
    keep = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def varlen_offsets(q, k, v, cu_seqlens):
    """The same packed documents given as FlashAttention's offsets (session 55): each token's document by
    searchsorted, a count the launcher evaluates per call as it does the ids."""
    i = torch.arange(q.shape[1], device=q.device)
    doc = torch.searchsorted(cu_seqlens, i, right=True) - 1
    keep = (doc[:, None] == doc[None, :]) & (i[None, :] <= i[:, None])
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def paged_decode(q, k_cache, v_cache, block_table, lens):
    B, Hq, D = q.shape
    P, Hkv = k_cache.shape[1], k_cache.shape[2]
    j = torch.arange(block_table.shape[1] * P, device=q.device)
    page = block_table[:, j // P]
    k, v = k_cache[page, j % P], v_cache[page, j % P]
    s = torch.einsum("bhgd,bshd->bhgs", q.view(B, Hkv, Hq // Hkv, D), k) * D ** -0.5
    s = s.masked_fill(j >= lens[:, None, None, None], float("-inf"))
    return torch.einsum("bhgs,bshd->bhgd", torch.softmax(s, -1), v).reshape(B, Hq, D)


def _bench(fn) -> float:
    import triton.testing as tt

    return tt.do_bench(fn, warmup=25, rep=200, return_mode="median")


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    return torch.compile(flex_attention, dynamic=False), create_block_mask


# ---------------------------------------------------------------- packed prefill


def random_lengths(n: int, total: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randperm(total - 1, generator=g)[: n - 1] + 1).values.tolist()
    edges = [0, *cuts, total]
    return [b - a for a, b in itertools.pairwise(edges)]


def prefill(docs: int, total: int, heads: int, dim: int, seed: int = 0) -> dict:
    import neptune_eq

    lengths = random_lengths(docs, total, seed)
    dev, dt = "cuda", torch.float16
    g = torch.Generator(device=dev).manual_seed(seed)
    q, k, v = (torch.randn(heads, total, dim, device=dev, dtype=dt, generator=g) for _ in range(3))
    doc = torch.repeat_interleave(torch.arange(docs, device=dev), torch.tensor(lengths, device=dev))
    starts = [0, *torch.cumsum(torch.tensor(lengths), 0).tolist()]
    ref = torch.empty(heads, total, dim, dtype=torch.float64, device=dev)
    for a, b in itertools.pairwise(starts):  # float64 per document
        ref[:, a:b] = F.scaled_dot_product_attention(q[:, a:b].double(), k[:, a:b].double(), v[:, a:b].double(),
                                                     is_causal=True)
    row = {"case": "packed_prefill", "documents": lengths, "heads": heads, "dim": dim, "total": total,
           "sum_sq_over_total_sq": sum(n * n for n in lengths) / total**2}
    t0 = time.perf_counter()
    ours = neptune_eq.compile(varlen_attention, q, k, v, doc)
    row["neptune_eq_compile_s"] = time.perf_counter() - t0
    row["neptune_eq_plan"] = ours.program.alternative.structure
    cu = torch.tensor(starts, device=dev)
    by_offsets = neptune_eq.compile(varlen_offsets, q, k, v, cu)
    peers = {"neptune_eq": lambda: ours(q, k, v, doc), "neptune_eq_offsets": lambda: by_offsets(q, k, v, cu)}
    try:
        flex, create_block_mask = _flex()

        def mask(b, h, qi, kv):
            return (doc[qi] == doc[kv]) & (kv <= qi)

        bm = create_block_mask(mask, 1, 1, total, total, device=dev)
        peers["flex_blockmask"] = lambda: flex(q[None], k[None], v[None], block_mask=bm)[0]
        row["flex_blockmask_build_ms"] = _bench(lambda: create_block_mask(mask, 1, 1, total, total, device=dev))
    except Exception as e:
        row["flex_error"] = f"{type(e).__name__}: {e}"[:300]
    longest = max(lengths)
    pad = torch.zeros(docs, heads, longest, dim, device=dev, dtype=dt)
    padded = [pad.clone() for _ in range(3)]
    for d, (a, b) in enumerate(itertools.pairwise(starts)):
        for t, x in zip(padded, (q, k, v)):
            t[d, :, : b - a] = x[:, a:b]

    def sdpa_padded():
        return F.scaled_dot_product_attention(*padded, is_causal=True)

    def unpad(o):
        return torch.cat([o[d, :, : b - a] for d, (a, b) in enumerate(itertools.pairwise(starts))], 1)

    peers["sdpa_padded"] = sdpa_padded
    check = {"sdpa_padded": lambda: unpad(sdpa_padded())}
    row["flops_causal_docs"] = 4 * heads * dim * sum(n * (n + 1) / 2 for n in lengths)
    for name, fn in peers.items():
        err = _rel((check.get(name) or fn)(), ref)
        row[f"{name}_rel_err"] = err
        row[f"{name}_ms"] = _bench(fn) if err < 1e-2 else None
    base = row.get("neptune_eq_ms")
    for name in peers:
        if base and row.get(f"{name}_ms") and name != "neptune_eq":
            row[f"speedup_vs_{name}"] = row[f"{name}_ms"] / base
    if base:
        row["neptune_eq_tflops"] = row["flops_causal_docs"] / base / 1e9
    return row


# ---------------------------------------------------------------- paged decode


def decode(requests: int, lo: int, hi: int, heads: tuple[int, int], dim: int, page: int, seed: int = 0,
           tune: bool = False) -> dict:
    import neptune_eq

    dev, dt = "cuda", torch.float16
    g = torch.Generator().manual_seed(seed)
    lens_l = torch.randint(lo, hi + 1, (requests,), generator=g).tolist()
    per = math.ceil(hi / page)
    n_pages = requests * per
    table = torch.randperm(n_pages, generator=g).view(requests, per).to(torch.int32).to(dev)
    hq, hkv = heads
    gd = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(requests, hq, dim, device=dev, dtype=dt, generator=gd)
    kc, vc = (torch.randn(n_pages, page, hkv, dim, device=dev, dtype=dt, generator=gd) for _ in range(2))
    lens = torch.tensor(lens_l, device=dev)
    S = per * page
    row = {"case": "paged_decode", "page": page, "requests": requests, "lens_min": min(lens_l),
           "lens_max": max(lens_l), "tokens": sum(lens_l), "heads": list(heads), "dim": dim}
    bytes_read = 2 * sum(lens_l) * hkv * dim * kc.element_size()  # K and V of every token, once
    row["bytes_read"] = bytes_read

    def gather():
        j = torch.arange(S, device=dev)
        pages = table[:, j // page]
        return (kc[pages, j % page].transpose(1, 2), vc[pages, j % page].transpose(1, 2))  # [B, Hkv, S, D]

    kg, vg = (x.contiguous() for x in gather())
    valid = torch.arange(S, device=dev)[None, :] < lens[:, None]
    ref = torch.empty(requests, hq, dim, dtype=torch.float64, device=dev)
    for b in range(requests):
        n = lens_l[b]
        kk, vv = (x[b, :, :n].double().repeat_interleave(hq // hkv, 0) for x in (kg, vg))
        ref[b] = F.scaled_dot_product_attention(q[b, :, None].double(), kk, vv)[:, 0]
    t0 = time.perf_counter()
    ours = neptune_eq.compile(paged_decode, q, kc, vc, table, lens)
    row["neptune_eq_compile_s"] = time.perf_counter() - t0
    row["neptune_eq_plan"] = ours.program.alternative.structure
    attn_mask = valid[:, None, None, :]

    def sdpa_on(kk, vv):
        return F.scaled_dot_product_attention(q[:, :, None], kk, vv, attn_mask=attn_mask, enable_gqa=True)[:, :, 0]

    peers = {"neptune_eq": lambda: ours(q, kc, vc, table, lens),
             "sdpa_gather": lambda: sdpa_on(*gather()),
             "sdpa_pregathered": lambda: sdpa_on(kg, vg)}
    try:
        flex, create_block_mask = _flex()

        def mask(b, h, qi, kv):
            return kv < lens[b]

        bm = create_block_mask(mask, requests, 1, 1, S, device=dev)
        peers["flex_pregathered"] = lambda: flex(q[:, :, None], kg, vg, block_mask=bm, enable_gqa=True)[:, :, 0]
    except Exception as e:
        row["flex_error"] = f"{type(e).__name__}: {e}"[:300]
    # the cost model sees the full padded length of every request (the lengths are data): time the
    # split-K alternatives it ranked below too, to show what the choice costs
    if tune:  # prog.tune(): the plan by measurement, then its kernels' tiles, warps and stages
        t0 = time.perf_counter()
        tuned = neptune_eq.compile(paged_decode, q, kc, vc, table, lens).tune(q, kc, vc, table, lens)
        row["tune_s"] = time.perf_counter() - t0
        chosen = tuned._variant((q, kc, vc, table, lens)).prog
        row["tuned_plan"] = chosen.alternative.structure
        row["tuned_schedules"] = [str(k.schedule) for k in chosen.kernels]
        peers["neptune_eq_tuned"] = lambda: tuned(q, kc, vc, table, lens)
    from neptune_eq.plan import Combine

    names = {"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "lens": lens}
    for a in ours.program.alternatives[:12]:
        chunks = [ph.chunks for k in a.plan.kernels for ph in k.phases if isinstance(ph, Combine)]
        if chunks and f"split_{chunks[0]}" not in peers:
            pinned = ours.program.pin(a.id)
            peers[f"split_{chunks[0]}"] = lambda p=pinned: p.run(names)["out0"]
    for name, fn in peers.items():
        try:
            err = _rel(fn(), ref)
        except Exception as e:
            row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
            continue
        row[f"{name}_rel_err"] = err
        row[f"{name}_ms"] = _bench(fn) if err < 1e-2 else None
    src = torch.empty(bytes_read // 2, dtype=torch.int8, device=dev)
    dst = torch.empty_like(src)
    copy_ms = _bench(lambda: dst.copy_(src))
    row["copy_bw_GBs"] = 2 * src.numel() / copy_ms / 1e6  # read + write of half the bytes
    for name in ("neptune_eq", "neptune_eq_tuned"):
        if row.get(f"{name}_ms"):
            row[f"{name}_read_GBs"] = bytes_read / row[f"{name}_ms"] / 1e6
            row[f"{name}_fraction_of_copy_bw"] = row[f"{name}_read_GBs"] / row["copy_bw_GBs"]
    if row.get("neptune_eq_ms"):
        best = min((row[f"{n}_ms"] for n in peers if n != "neptune_eq" and not n.startswith(("split_", "neptune_eq"))
                    and row.get(f"{n}_ms")), default=None)
        if best:
            row["speedup_vs_best_peer"] = best / row["neptune_eq_ms"]
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["prefill", "paged"])
    ap.add_argument("--pages", nargs="+", type=int, default=[16, 64])
    ap.add_argument("--total", type=int, default=32768)
    ap.add_argument("--out")
    ap.add_argument("--tune", action="store_true", help="paged decode: also time the program after prog.tune()")
    args = ap.parse_args()
    import triton
    from cases import record

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d")}
    jobs = []
    if args.only in (None, "prefill"):
        jobs.append(lambda: prefill(16, args.total, 32, 128))
    if args.only in (None, "paged"):
        jobs += [lambda p=p: decode(32, 1024, 32768, (32, 8), 128, p, tune=args.tune) for p in args.pages]
    rows = []
    for job in jobs:
        try:
            row = job()
        except Exception as e:  # one case failing is reported, the rest still run
            import traceback

            traceback.print_exc()
            row = {"error": f"{type(e).__name__}: {e}"[:500]}
        record(rows, row, args.out, meta)


if __name__ == "__main__":
    main()
