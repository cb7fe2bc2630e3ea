"""Where fused_moe's host time goes on the cuda decode path (T = 1, E = 8, H = I = 128, the
`bench overhead` problem): host us per call of each layer, from the public op down to the one C
call, beside the empty 9-tensor custom op. Prints a table; `python scripts/moe_host_breakdown.py`."""
import ctypes

import torch

from torch_fp4 import meta, ops
from torch_fp4 import testing as T
from torch_fp4.bench.overhead import empty_op, host_us
from torch_fp4.kernels import _common
from torch_fp4.kernels._common import tactic_or_default
from torch_fp4.kernels.cuda import moe as CM
from torch_fp4.kernels.cuda.moe_tactics import MOE_SPACE
from torch_fp4.kernels.cuda.native import library, raw_stream
from torch_fp4.problems import MoeProblem


def main():
    dev = torch.device("cuda")
    rows = []
    with torch.inference_mode():
        kw = T.moe_problem(1, 128, 128, 8, 2, dev, w4a4=False)
        x, w1, w1s, g1, w2, w2s, g2, ids, tw = (kw[k] for k in ("x", "w1", "w1_scale", "w1_global_scale", "w2",
                                                                 "w2_scale", "w2_global_scale", "topk_ids",
                                                                 "topk_weights"))
        p = MoeProblem.of(x, w1, w1s, w2, w2s, ids, None, None, 0, w1.shape[0], torch.bfloat16)
        t = tactic_or_default(None, MOE_SPACE, p, op="fused_moe")
        d = CM._decode(p, t, w1s, w2s)
        out = torch.empty_like(x)
        ws = torch.empty(d.workspace_bytes, dtype=torch.uint8, device=dev)
        lib = library(0, d.library)
        i = 0
        ptrs = [t_.data_ptr() for t_ in (x, w1, w1s, g1, w2, w2s, g2, ids, tw)]
        stream = raw_stream(0)
        fn = lib.moe_decode

        def c_call(graph=None):
            fn(i, stream, _common.PDL, d.address, ptrs[0], ptrs[1], ptrs[2], ptrs[3], ptrs[4], ptrs[5],
               ptrs[6], ptrs[7], ptrs[8], None, None, None, None, out.data_ptr(), ws.data_ptr(), graph)

        def public_direct():
            CM.EAGER_GRAPHS = False
            try:
                return ops.fused_moe(**kw)
            finally:
                CM.EAGER_GRAPHS = True

        cases = [
            ("empty custom op, 9 tensors", lambda: empty_op(9)(x, w1, w1s, g1, w2, w2s, g2, ids, tw)),
            ("ops.fused_moe (public)", lambda: ops.fused_moe(**kw)),
            ("torch.ops.torch_fp4.fused_moe", lambda: torch.ops.torch_fp4.fused_moe(
                x, w1, w1s, g1, w2, w2s, g2, ids, tw, None, None, 0, None, None, 0)),
            ("cuda launcher (problem, tactic given)", lambda: CM.fused_moe(
                x, w1, w1s, g1, w2, w2s, g2, ids, tw, None, None, 0, torch.bfloat16, True, tactic=t, problem=p)),
            ("_small_m_moe", lambda: CM._small_m_moe(x, w1, w1s, g1, w2, w2s, g2, ids, tw, None, None,
                                                     torch.bfloat16, p, t)),
            ("ops.fused_moe, direct launches", public_direct),
            ("C call alone (4 direct launches)", c_call),
            ("C call alone (one graph launch)", lambda: c_call(d.graph.address)),
            ("torch.empty(workspace)", lambda: torch.empty(d.workspace_bytes, dtype=torch.uint8, device=dev)),
            ("meta.fused_moe + prepare_outputs", lambda: _common.prepare_outputs(meta.fused_moe(x, torch.bfloat16))),
            ("9 x .contiguous()", lambda: [t_.contiguous() for t_ in (x, w1, w1s, g1, w2, w2s, g2, ids, tw)]),
            ("17 x data_ptr()", lambda: [t_.data_ptr() for t_ in (x, w1, w1s, g1, w2, w2s, g2, ids, tw, out, ws,
                                                                 x, w1, w1s, g1, w2, w2s)]),
            ("torch.empty_like(x) + x.add_(0) (one launch)", lambda: torch.empty_like(x).add_(0)),
        ]
        for name, f in cases:
            try:
                rows.append((name, host_us(f, dev, calls=500)))
            except Exception as exc:   # a layer's call failed: say so, go on
                rows.append((f"{name} FAILED {type(exc).__name__}: {str(exc)[:80]}", float("nan")))

        rows += eager_loops(dev)
    print(f"{'layer':<52} {'host us':>8}")
    for name, us in rows:
        print(f"{name:<52} {us:>8.2f}")


def eager_loops(dev, calls: int = 300) -> list:
    """Wall time per call of `calls` eager fused_moe calls then one synchronization (what an
    eager caller sees: the larger of host and device time), graph launches against direct ones,
    on model shapes (bench moe's routed batches, seed 0)."""
    import time

    from torch_fp4.bench.moe import MODELS, routed_batch
    rows = []
    for name, tokens in (("Qwen3-30B-A3B", 1), ("Qwen3-30B-A3B", 4), ("Mixtral-8x7B", 1), ("DeepSeek-V3", 1)):
        m = next(m for m in MODELS if m.name == name)
        gen = torch.Generator(device=dev).manual_seed(0)
        w1, w2, x, ids, tw = routed_batch(m, m.experts, tokens, dev, gen)
        for graphs in (True, False, True, False):
            CM.EAGER_GRAPHS = graphs
            try:
                for _ in range(20):
                    ops.fused_moe(x, *w1, *w2, ids, tw)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    ops.fused_moe(x, *w1, *w2, ids, tw)
                torch.cuda.synchronize()
                us = (time.perf_counter() - t0) / calls * 1e6
            finally:
                CM.EAGER_GRAPHS = True
            rows.append((f"eager loop {name} T={tokens} {'graph' if graphs else 'direct'}", us))
        del w1, w2
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main()
