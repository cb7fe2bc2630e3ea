"""Host us per call of each layer of fused_moe's decode path (bench overhead's T = 1, E = 8
problem), from the public function down to the C call: where the host time goes."""
import statistics
import sys
import time

import torch

import torch_fp4 as t4
from torch_fp4 import testing as T
from torch_fp4.bench.overhead import empty_op, host_us
from torch_fp4.kernels.cuda import moe as K
from torch_fp4.kernels.cuda.native import library, raw_stream
from torch_fp4.ops import _registry as R
from torch_fp4.ops import moe as M


def main(rounds: int = 3) -> None:
    dev = torch.device("cuda")
    moe = T.moe_problem(1, 128, 128, 8, 2, dev, w4a4=False)
    x, w1, s1, g1, w2, s2, g2, ids, tw = moe.values()
    args = (x, w1, s1, g1, w2, s2, g2, ids, tw, None, None, 0, None, None, 0)
    p, _ = M._moe_problem(*args)
    run_args = args + (16, None, None, "swiglu", 1.702, 7.0, None, "row")   # run()'s: every schema argument
    _, t = R.decide("fused_moe", t4.Backend.CUDA, p, ())
    d = K._decode(p, t, s1, s2)
    lib = library(0, d.library)
    ws = torch.empty(d.workspace_bytes, dtype=torch.uint8, device=dev)
    out = torch.empty_like(x)
    ptrs = [a.data_ptr() for a in (x, w1, s1, g1, w2, s2, g2, ids, tw)]
    stream = raw_stream(0)
    empty9 = empty_op(9)
    cases = {
        "empty custom op, 9 tensors": lambda: empty9(*moe.values()),
        "public fused_moe": lambda: t4.fused_moe(**moe),
        "eager() check": lambda: R.eager(*args[:11]),
        "plan key (the op's key_function)": lambda: R._KEYS["fused_moe"](M._moe_problem, run_args),
        "ops.moe._fused_moe (run)": lambda: M._fused_moe(*args),
        "backend fused_moe (p, t given)": lambda: K.fused_moe(x, w1, s1, g1, w2, s2, g2, ids, tw, None, None, 0,
                                                              torch.bfloat16, True, tactic=t, problem=p),
        "_small_m_moe": lambda: K._small_m_moe(x, w1, s1, g1, w2, s2, g2, ids, tw, None, None, torch.bfloat16, p, t),
        "C call alone (4 direct launches)": lambda: lib.moe_decode(0, stream, 1, d.address, *ptrs, None, None, None,
                                                                    None, out.data_ptr(), ws.data_ptr(), None),
        "C call alone (one graph launch)": lambda: lib.moe_decode(0, stream, 1, d.address, *ptrs, None, None, None,
                                                                   None, out.data_ptr(), ws.data_ptr(),
                                                                   d.graph.address),
        "torch.empty out": lambda: torch.empty_like(x),
        "torch.empty workspace": lambda: torch.empty(d.workspace_bytes, dtype=torch.uint8, device=dev),
        "4 x contiguous()": lambda: (g1.contiguous(), g2.contiguous(), ids.contiguous(), tw.contiguous()),
        "13 x data_ptr()": lambda: [a.data_ptr() for a in (x, w1, s1, g1, w2, s2, g2, ids, tw, out, ws, x, x)],
        "raw_stream + library": lambda: (raw_stream(0), library(0, d.library)),
        "_decode lookup": lambda: K._decode(p, t, s1, s2),
    }
    res = {k: [] for k in cases}
    with torch.inference_mode():
        for _ in range(rounds):
            for k, fn in cases.items():
                res[k].append(host_us(fn, dev, calls=500, repeats=5))
    print(f"{'layer':<34} " + " ".join(f"{'round ' + str(i + 1):>8}" for i in range(rounds)) + f" {'median':>8}")
    for k, v in res.items():
        print(f"{k:<34} " + " ".join(f"{u:>8.1f}" for u in v) + f" {statistics.median(v):>8.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
