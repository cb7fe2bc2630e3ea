"""CPU checks of the Triton `tl.dot_scaled` FP4 GEMM (torch_fp4/kernels/triton/mm_dot_scaled.py),
which is compiled and checked here but never run on a GPU (compiled, not run: no Blackwell GPU
was available).

Compiled with ASTSource for GPUTarget("cuda", 100, 32), one kernel for 103 and two for 120,
about 1.5 s each (CONFIGS): NVFP4 and MXFP4, activations on the MMA's M side and the swapped
decode form, 128x4 and linear activation scales, bf16/fp16/fp32 outputs. Checked: PTX `.target`;
on sm_100a/sm_103a `tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16` (NVFP4: e4m3
scales per 16) or `kind::mxf4.block_scale.block32` (MXFP4: ue8m0 scales per 32), spelled
`scale_vec::4X` / `scale_vec::2X` by Triton 3.6 (both versions pass), no decomposition into
`kind::f16` MMAs, the output conversion, and in the SASS (nvdisasm/cuobjdump) the block-scaled
`UTCOMMA gdesc, gdesc, tmem(acc), tmem(SFA), idesc, tmem(SFB)` (`.4X` NVFP4 on sm_100a,
`.BLOCK16` on sm_103a); on sm_120a the warp-level `mma.sync.aligned.m16n8k64 ... block_scale`
and SASS `OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X` / `...E8`. Skipped when Triton lacks
tl.dot_scaled or cannot target sm_100.

Under Triton's interpreter the launcher and kernel run on grid-exact operands and must equal the
reference bit for bit (INTERP_CASES: both formats, all activation scale layouts, swapped and
not, M/N/K tails; skipped on Triton 3.6, whose interpreter has no tl.dot_scaled). The CPU tests
check the tactic dataclass: why_not reasons, candidates, default, JSON round trip.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sass_tools import disassemble, have_disassembler  # noqa: E402
from torch_fp4 import formats as F  # noqa: E402
from torch_fp4.kernels.triton import mm_dot_scaled_tactics as T  # noqa: E402
from torch_fp4.problems import MmProblem  # noqa: E402
from torch_fp4.tactics import tactic_from_json  # noqa: E402

DIV16 = [["tt.divisibility", 16]]
_OUT = {"bf16": (tl.bfloat16, "*bf16"), "f16": (tl.float16, "*fp16"), "f32": (tl.float32, "*fp32")}
_TCGEN05_SASS = re.compile(r"UTCOMMA(\.4X|\.BLOCK16)?\s+gdesc\[\w+\], gdesc\[\w+\], "
                           r"tmem\[\w+\], tmem\[\w+\], idesc\[\w+\], tmem\[\w+\]")


@pytest.fixture(scope="module")
def sm100():
    """Skip unless this Triton has tl.dot_scaled and compiles for sm_100."""
    if not hasattr(tl, "dot_scaled"):
        pytest.skip(f"triton {triton.__version__} has no tl.dot_scaled")

    @triton.jit
    def _probe(x_ptr):
        tl.store(x_ptr, 1.0)
    try:
        triton.compile(ASTSource(fn=_probe, signature={"x_ptr": "*fp32"}),
                       target=GPUTarget("cuda", 100, 32), options={"enable_fp_fusion": False})
    except Exception as exc:  # noqa: BLE001 - any failure means no sm_100 target
        pytest.skip(f"triton {triton.__version__} cannot compile for sm_100: {exc}")


def _compile(mx, bm, bn, bk, swap, layout=0, out="bf16", warps=4, stages=3, arch=100):
    from torch_fp4.kernels.triton import mm_dot_scaled as D
    out_tl, out_ptr = _OUT[out]
    sig = {"a_ptr": "*u8", "as_ptr": "*u8", "b_ptr": "*u8", "bs_ptr": "*u8", "alpha_ptr": "*fp32",
           "out_ptr": out_ptr, "M": "i32", "N": "i32", "K": "i32", "a_kp": "i32", "b_kp": "i32"}
    consts = dict(MX=mx, BLOCK=32 if mx else 16, A_LAYOUT=layout, HAS_ALPHA=True, SWAP=swap,
                  OUT=out_tl, BM=bm, BN=bn, BK=bk, GROUP_M=8, USE_GDC=False)
    sig.update({k: "constexpr" for k in consts})
    # Pointers 16-byte aligned and K a multiple of 16, as Triton specializes them at launch.
    src = ASTSource(fn=D._mm_dot_scaled_kernel, signature=sig, constexprs=consts,
                    attrs={(i,): DIV16 for i in (0, 1, 2, 3, 5, 8)})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps, "num_stages": stages,
                                   "enable_fp_fusion": False})


CONFIGS = [
    dict(mx=False, bm=128, bn=128, bk=256, swap=False),
    dict(mx=True, bm=128, bn=128, bk=256, swap=False),
    dict(mx=False, bm=16, bn=128, bk=256, swap=True, out="f16"),
    dict(mx=True, bm=64, bn=128, bk=256, swap=True, out="f32"),
    dict(mx=False, bm=256, bn=128, bk=256, swap=False, warps=8),
    dict(mx=False, bm=128, bn=256, bk=128, swap=False, layout=2, warps=8),   # linear act scales
    dict(mx=False, bm=128, bn=128, bk=256, swap=False, arch=103),
    dict(mx=False, bm=128, bn=128, bk=256, swap=False, warps=8, stages=2, arch=120),
    dict(mx=True, bm=64, bn=128, bk=256, swap=True, stages=2, arch=120),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_dot_scaled_kernel_uses_block_scaled_mma(sm100, cfg):
    kernel = _compile(**cfg)
    ptx = kernel.asm["ptx"]
    arch = cfg.get("arch", 100)
    assert re.search(r"\.target\s+(\S+)", ptx).group(1) == f"sm_{arch}a"
    out = cfg.get("out", "bf16")
    if out != "f32":
        assert re.search(rf"cvt\.rn\.{'bf16' if out == 'bf16' else 'f16'}(x2)?\.f32", ptx)
    if arch == 120:
        _check_sm120(kernel, cfg["mx"])
        return
    mma = set(re.findall(r"tcgen05\.mma[\w.:]*", ptx))
    # PTX spells the scale block size .block16/.block32 (Triton 3.9) or scale_vec::4X/2X (3.6).
    want = (r"kind::mxf4(nvf4)?\.block_scale\.(block32|scale_vec::2X)" if cfg["mx"]
            else r"kind::mxf4nvf4\.block_scale\.(block16|scale_vec::4X)")
    assert any(re.search(want, s) for s in mma), mma
    assert not any("kind::f16" in s or "kind::tf32" in s for s in mma), mma   # not decomposed
    if not have_disassembler():
        return
    sass = disassemble(kernel.asm["cubin"])
    ops = re.findall(r"\bUTC\w*MMA[\w.]*[^;]*", sass)
    assert any(_TCGEN05_SASS.search(s) for s in ops), ops[:4]
    if arch == 103 and not cfg["mx"]:
        assert any(".BLOCK16" in s for s in ops), ops[:4]


def _check_sm120(kernel, mx):
    """sm_120a: warp-level m16n8k64 block-scaled mma.sync (SASS OMMA.SF), no tcgen05."""
    ptx = kernel.asm["ptx"]
    mma = set(re.findall(r"mma\.sync[\w.:]*", ptx))
    want = (r"m16n8k64\.row\.col\.kind::mxf4(nvf4)?\.block_scale\.scale_vec::2X.*ue8m0" if mx
            else r"m16n8k64\.row\.col\.kind::mxf4nvf4\.block_scale\.scale_vec::4X.*ue4m3")
    assert any(re.search(want, s) for s in mma) and "tcgen05" not in ptx, mma
    if have_disassembler():
        sass = disassemble(kernel.asm["cubin"])
        want = "OMMA.SF.16864.F32.E2M1.E2M1." + ("E8" if mx else "UE4M3.4X")
        assert want in sass, sorted(set(re.findall(r"\b\w*MMA[\w.]*", sass)))


# ---------------------------------------------------------------------------------------------
# The launcher and kernel under Triton's interpreter (numpy): scale addressing, swap, masks
# ---------------------------------------------------------------------------------------------
_INTERP_SCRIPT = r"""
import json, sys
import numpy as np, torch
import triton.language as tl
import triton.runtime.interpreter as I
from torch_fp4 import formats as F
from torch_fp4.kernels import _common
from torch_fp4.kernels.triton import mm_dot_scaled as D
from torch_fp4.kernels.triton import mm_dot_scaled_tactics as T
from torch_fp4.reference.gemm import mm_fp4 as reference
from torch_fp4.testing import grid_exact_operand
if not hasattr(I, "_dot_scaled_scale_to_f32"):
    print(json.dumps("this Triton's interpreter cannot run tl.dot_scaled (Triton 3.6 has none)"))
    sys.exit(0)
to_f32 = I._dot_scaled_scale_to_f32
def scale_to_f32(handle, compute_type):   # the interpreter reads every scale byte as ue8m0
    if handle.dtype == tl.float8e4nv:
        return torch.from_numpy(handle.data.view(np.uint8).copy()).view(torch.float8_e4m3fn).float().numpy()
    return to_f32(handle, compute_type)
I._dot_scaled_scale_to_f32 = scale_to_f32
from torch_fp4.problems import MmProblem
_common.POISON_OUTPUTS = True
out = []
for m, n, k, fmt, layout, t, dt in json.loads(sys.argv[1]):
    fmt, dt, t = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}[fmt], getattr(torch, dt), T.DotScaledMmTactic(*t)
    g = torch.Generator().manual_seed(m * n + k)
    a, a_scale, _ = grid_exact_operand(m, k, fmt, layout, g)
    w, w_scale, _ = grid_exact_operand(n, k, fmt, "128x4", g)
    args = (a, w.T, a_scale, w_scale.T, torch.full((1,), 0.75), dt, fmt, F.SfLayout.parse(layout))
    p = MmProblem.of(*args).on((10, 0))   # CPU tensors, checked as on sm_100
    assert T.problem_reason(p) is None and T.why_not(t, p) is None, t.label()
    got, want = D.mm_fp4_dot_scaled(*args, tactic=t, problem=p), reference(*args)
    out.append([t.label(), fmt.name, layout, m, n, k, torch.equal(got, want)])
print(json.dumps(out))
"""
# (M, N, K, format, activation scale layout, tactic fields, out dtype): K tails (K % block_k),
# M/N tails, the 5-D 128x4 path and the gathered one (8x4, linear, swapped 16..64-row blocks).
# bf16 output is left out: the interpreter converts fp32 -> bf16 by truncation, the compiled
# kernel with cvt.rn (checked above).
INTERP_CASES = [
    (200, 300, 320, "nvfp4", "128x4", (128, 128, 256), "float32"),
    (200, 300, 320, "mxfp4", "128x4", (128, 128, 256), "float32"),
    (130, 260, 512, "nvfp4", "linear", (128, 128, 128), "float16"),
    (70, 129, 384, "nvfp4", "8x4", (256, 128, 256), "float32"),
    (300, 384, 1024, "mxfp4", "128x4", (256, 128, 256), "float16"),
    (5, 300, 320, "nvfp4", "128x4", (16, 128, 256, True), "float32"),
    (5, 130, 96, "nvfp4", "linear", (16, 128, 64, True), "float16"),
    (33, 200, 256, "mxfp4", "128x4", (64, 256, 256, True), "float32"),
    (100, 300, 320, "mxfp4", "8x4", (64, 128, 128, True), "float32"),
]


def test_kernel_under_interpreter_equals_reference():
    """Grid-exact operands (every partial sum exact in fp32): the result equals the reference
    bit for bit. The interpreter emulates tl.dot_scaled in numpy; it decodes every scale byte as
    ue8m0, so the script teaches it e4m3 scales (NVFP4) first."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _INTERP_SCRIPT, json.dumps(INTERP_CASES)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    if isinstance(results, str):
        pytest.skip(results)
    assert len(results) == len(INTERP_CASES)
    assert all(r[-1] for r in results), [r for r in results if not r[-1]]


# ---------------------------------------------------------------------------------------------
# CPU: the tactic dataclass
# ---------------------------------------------------------------------------------------------
def _args(m=300, n=256, k=512, fmt=F.NVFP4, layout=F.SfLayout.LAYOUT_128x4, with_scale=True,
          out=torch.bfloat16, cap=None):
    """An mm_fp4 problem of CPU tensors, on a device of compute capability `cap` if given."""
    a = torch.zeros(m, k // 2, dtype=torch.uint8)
    b = torch.zeros(n, k // 2, dtype=torch.uint8).T
    kb = k // fmt.block_size
    a_scale = torch.zeros(*F.padded_scale_shape(m, kb, layout), dtype=torch.uint8) if with_scale else None
    b_scale = torch.zeros(*F.padded_scale_shape(n, kb, "128x4"), dtype=torch.uint8).T
    p = MmProblem.of(a, b, a_scale, b_scale, None, out, fmt, layout)
    return p if cap is None else p.on(cap)


def _why_not(t, p, cap=None):
    """The Triton space's answer: the kernel's problem limits, then the tactic's own."""
    from torch_fp4.kernels.triton import mm_tactics
    return mm_tactics.why_not(t, p if cap is None else p.on(cap))


def test_why_not_reasons():
    t = T.DotScaledMmTactic(128, 128, 256)
    args = _args()
    assert _why_not(t, args, cap=(10, 0)) is None
    assert _why_not(t, args, cap=(10, 3)) is None
    assert "10.0 / 10.3" in T.problem_reason(args.on((9, 0)))
    assert "10.0 / 10.3" in _why_not(t, args, cap=(9, 0))
    assert "10.0 / 10.3" in _why_not(t, args)          # CPU tensors: capability 0.0
    assert "sm_12x budget" in _why_not(t, args, cap=(12, 0))
    assert _why_not(T.DotScaledMmTactic(128, 128, 256, num_stages=2), args, cap=(12, 0)) is None
    assert "W4A4" in T.problem_reason(_args(with_scale=False, cap=(10, 0)))
    assert "W4A4" in _why_not(t, _args(with_scale=False), cap=(10, 0))
    assert "empty problem" in T.problem_reason(_args(m=0, cap=(10, 0)))
    assert _why_not(t, _args(fmt=F.MXFP4), cap=(10, 0)) is None
    assert _why_not(t, _args(layout=F.SfLayout.LINEAR), cap=(10, 0)) is None
    assert "M side" in _why_not(T.DotScaledMmTactic(64, 128, 256), args, cap=(10, 0))
    assert "M side" in _why_not(T.DotScaledMmTactic(16, 64, 256, swap_ab=True), args, cap=(10, 0))
    assert "N side" in _why_not(T.DotScaledMmTactic(8, 128, 256, swap_ab=True), args, cap=(10, 0))
    assert "128-row" in _why_not(T.DotScaledMmTactic(128, 64, 256), args, cap=(10, 0))
    assert "multiple of 128" in _why_not(T.DotScaledMmTactic(128, 128, 64), _args(fmt=F.MXFP4),
                                         cap=(10, 0))
    assert _why_not(T.DotScaledMmTactic(128, 128, 64), args, cap=(10, 0)) is None
    assert "shared memory" in _why_not(T.DotScaledMmTactic(256, 256, 512, num_stages=4), args,
                                       cap=(10, 0))


@pytest.mark.parametrize("cap", [(10, 0), (12, 0)])
def test_candidates_and_default(cap):
    for m in (1, 8, 64, 100, 4096):
        for fmt in F.FORMATS:
            args = _args(m=m, fmt=fmt, cap=cap)
            cands = T.candidates(args)
            assert cands and all(_why_not(c, args) is None for c in cands)
            d = T.default(args)
            assert _why_not(d, args) is None and d.swap_ab == (m <= 64)
    assert T.default(_args(m=8, cap=cap)).block_m == 16
    assert T.candidates(_args(cap=(9, 0))) == [] and T.candidates(_args(with_scale=False, cap=cap)) == []


def test_tactic_json_round_trip_and_family():
    t = T.DotScaledMmTactic(32, 128, 256, swap_ab=True, num_stages=4)
    back = tactic_from_json(t.to_json())
    assert back == t and type(back) is T.DotScaledMmTactic
    assert t.family == "triton_mm_dot_scaled" and "swap_ab=True" in t.label()
