"""The CuTe DSL grouped MoE GEMM (torch_fp4/kernels/cute/moe_blockscaled.py) compiles for sm_100a
and sm_103a with no GPU, and its PTX/SASS hold the block-scaled MMA. Compiled and SASS-checked
in CI, never run (compiled, not run): no Blackwell GPU was available.

Compiled (one interpreter per architecture, CUTE_DSL_ARCH), a representative subset to keep
the file near 30 s (about 2-4 s per kernel):
- sm_100a: FC2 128x128x256 (cluster 1x1), FC2 128x256x256 (2x1), FC1 SwiGLU 128x256x256 (1x1
  and 2x1);
- sm_103a: FC2 128x128x768 (1x1), FC2 128x256x768 (2x1), FC1 SwiGLU 128x256x768 (1x1);
- MXFP4 operands (MXFP4 experts with MXFP4 activations: e8m0 scales per 32, `.block32`): FC1
  SwiGLU 128x256x256 and FC2 128x128x256 on sm_100a, FC1 SwiGLU 128x256x768 on sm_103a.
Not compiled here: the remaining cluster variants of the same tile shapes (the cluster changes
the multicast masks only; tests/test_cute_mm_compile.py covers those on the dense kernel).
Checked, as the dense mm test: PTX `.target`, `tcgen05.mma.cta_group::1.kind::mxf4nvf4
.block_scale.block16` (MXFP4: `.block32`), SASS `UTCOMMA` with tensor-memory accumulator and scale-factor operands
and `UTCCP`. FC1 also: the gate/up B box is a 5-D TMA (row, gate/up half, N tile, expert over
K), silu's exp is libdevice expf (`ex2.approx.ftz.f32`, SASS `MUFU.EX2`), its division is
`div.rn.f32` with no approximate division or reciprocal (`div.full`, `div.approx`,
`rcp.approx`), and the bf16 roundings are `cvt.rn.bf16.f32`. FC2 has no exp. The scale-factor
view of w1's gate/up rows is checked against the spec's 128x4 formula; the CPU tests check the
tactic lists, why_not reasons and the JSON round trip.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_fp4.kernels.cute import moe_tactics as T
from torch_fp4.tactics import tactic_from_json

ROOT = Path(__file__).resolve().parents[1]
HAVE_CUTLASS = importlib.util.find_spec("cutlass") is not None

_SCRIPT = r"""
import json, re, sys
sys.path.insert(0, sys.argv[2])
import cutlass
from sass_tools import disassemble, have_disassembler
from torch_fp4.kernels.cute import moe_blockscaled as M
from torch_fp4.kernels.cute import moe_tactics as T
from torch_fp4.tactics import tactic_from_json
arch = sys.argv[1]
out = []
for t, swiglu, nvfp4 in json.loads(sys.argv[3]):
    tactic = tactic_from_json(t)
    fn = M.compile_only(M.MoeKey(tactic, swiglu, 128 * tactic.cluster_m, arch, nvfp4))
    ptx, cubin = fn.__ptx__, fn.__cubin__
    sass = disassemble(cubin) if have_disassembler() else ""
    out.append({"tactic": tactic.label(), "swiglu": swiglu, "nvfp4": nvfp4,
                "target": re.search(r"\.target\s+(\S+)", ptx).group(1),
                "ptx_mma": sorted(set(re.findall(r"tcgen05\.mma[\w.:]*", ptx))),
                "tma": sorted(set(re.findall(r"cp\.async\.bulk\.tensor\.(\dd)", ptx))),
                "ptx_ops": sorted(set(re.findall(r"\b(?:ex2|div|rcp|cvt\.rn\.bf16)\.[\w.]*", ptx))),
                "sass_mma": sorted(set(re.findall(r"\bUTC\w*MMA[\w.]*[^;]*", sass))),
                "mufu": sorted(set(re.findall(r"MUFU\.\w+", sass))),
                "utccp": "UTCCP" in sass, "have_sass": bool(sass)})

# w1's scale factors seen through the gate/up view: virtual row (r, h, j) -> row h I + 128 j + r
I, K, E = 384, 512, 2
kp = -(-(K // 16) // 4) * 4
got = {}
@cutlass.cute.jit
def sf_view():
    lay = M.gate_up_sf_layout(I, K, E, 16)
    for e in cutlass.range_constexpr(E):
        for vr in (0, 5, 37, 127, 128, 130, 200, 255, 256, 300, 383, 384, 511, 640, 767):
            for kb in (0, 1, 3, 4, 7, 31):
                got[(e, vr, kb)] = int(lay((vr, kb * 16, e)))
sf_view()
bad = []
for (e, vr, kb), v in got.items():
    m = ((vr // 128) % 2) * I + 128 * (vr // 256) + vr % 128
    want = (e * 2 * I * kp + ((m // 128) * (kp // 4) + kb // 4) * 512 + (m % 32) * 16
            + ((m % 128) // 32) * 4 + kb % 4)
    if v != want:
        bad.append((e, vr, kb, v, want))
print(json.dumps({"kernels": out, "sf_checked": len(got), "sf_bad": bad}))
"""

_TCGEN05_SASS = re.compile(r"UTCOMMA(\.4X|\.BLOCK16)?\s+gdesc\[\w+\], gdesc\[\w+\], "
                           r"tmem\[\w+\], tmem\[\w+\], idesc\[\w+\], tmem\[\w+\]")

S = T.Sm100MoeTactic
COMPILED = {   # (tactic, FC1 with SwiGLU, NVFP4 operands; else MXFP4, kind::mxf4nvf4 .block32)
    "sm_100a": [(S(128, 256, 1), False, True), (S(256, 256, 2), False, True), (S(256, 256, 1), True, True),
                (S(256, 256, 2), True, True), (S(256, 256, 1), True, False), (S(128, 256, 1), False, False)],
    "sm_103a": [(S(128, 768, 1), False, True), (S(256, 768, 2), False, True), (S(256, 768, 1), True, True),
                (S(256, 768, 1), True, False)],
}


@pytest.mark.skipif(not HAVE_CUTLASS, reason="nvidia-cutlass-dsl (cutlass) is not installed")
@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a"])
def test_moe_kernels_compile_with_block_scaled_mma(arch, tmp_path):
    env = dict(os.environ, CUTE_DSL_ARCH=arch, CUTE_DSL_DUMP_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    keys = [(t.to_json(), swiglu, nvfp4) for t, swiglu, nvfp4 in COMPILED[arch]]
    script = tmp_path / "compile_moe.py"     # a file: CuTe DSL reads the source of sf_view
    script.write_text(_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), arch, str(ROOT / "tests"),
                           json.dumps(keys)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["sf_checked"] > 0 and res["sf_bad"] == [], res["sf_bad"][:5]
    results = res["kernels"]
    assert len(results) == len(keys)
    for r in results:
        assert r["target"] == arch, r
        ptx = " ".join(r["ptx_mma"])
        block = ".block16" if r["nvfp4"] else ".block32"   # e4m3 / 16 or e8m0 / 32 scales
        assert "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale" + block in ptx, r
        ops = r["ptx_ops"]
        if r["swiglu"]:
            assert "5d" in r["tma"], r      # the gate/up B box spans two gmem dimensions
            assert "ex2.approx.ftz.f32" in ops, "silu's exp should be libdevice expf"
            assert "div.rn.f32" in ops, r
            assert "cvt.rn.bf16.f32" in ops, r
            assert not any(o.startswith(("div.full", "div.approx", "rcp.approx")) for o in ops), \
                "SwiGLU's division must be correctly rounded"
        else:
            assert not any(o.startswith(("ex2", "div")) for o in ops), r
            assert "cvt.rn.bf16.f32" in ops, r
        if not r["have_sass"]:
            continue
        assert any(_TCGEN05_SASS.search(s) for s in r["sass_mma"]), r
        assert r["utccp"], r
        assert ("MUFU.EX2" in r["mufu"]) == r["swiglu"], r


# ---------------------------------------------------------------------------------------------
# CPU: tactic lists, why_not, JSON
# ---------------------------------------------------------------------------------------------
def _args(rows=512, experts=4, n=512, k=512, swiglu=False, block_m=128):
    a = torch.zeros(rows, k // 2, dtype=torch.uint8)
    kp = -(-(k // 16) // 4) * 4
    a_scale = torch.zeros(rows, kp, dtype=torch.uint8)
    w = torch.zeros(experts, n, k // 2, dtype=torch.uint8)
    w_scale = torch.zeros(experts, -(-n // 128) * 128, kp, dtype=torch.uint8)
    alpha = torch.ones(experts)
    ids = torch.zeros(rows // block_m, dtype=torch.int32)
    return (a, a_scale, w, w_scale, alpha, ids, swiglu, block_m)


def test_tactic_lists_by_capability():
    sm100, sm103 = T.tactics_for_capability((10, 0)), T.tactics_for_capability((10, 3))
    assert {(t.tile_n, t.tile_k) for t in sm100} == {(128, 256), (256, 256)}
    assert set(sm100) < set(sm103)
    assert {(t.tile_n, t.tile_k) for t in sm103 if t.tile_k == 768} == {(128, 768), (256, 768)}
    assert {t.cluster_m for t in sm103} == {1, 2}
    assert T.tactics_for_capability((9, 0)) == () and T.tactics_for_capability((12, 0)) == ()
    for t in sm103:
        assert t.invalid() is None, t
        assert tactic_from_json(json.loads(json.dumps(t.to_json()))) == t


def test_why_not_reasons():
    fc2, fc1 = _args(), _args(swiglu=True)
    t = S(128, 256, 1)
    assert T.why_not(t, *fc2, cap=(10, 0)) is None
    assert "capability 10.0" in T.why_not(S(128, 768, 1), *fc2, cap=(10, 0))
    assert T.why_not(S(128, 768, 1), *fc2, cap=(10, 3)) is None
    assert "tile_n=256" in T.why_not(t, *fc1, cap=(10, 0))
    assert T.why_not(S(256, 256, 1), *fc1, cap=(10, 0)) is None
    assert "multiple of 128" in T.why_not(S(256, 256, 1), *_args(n=320, swiglu=True), cap=(10, 0))
    assert "blocks of 256" in T.why_not(S(128, 256, 2), *fc2, cap=(10, 0))
    assert T.why_not(S(128, 256, 2), *_args(block_m=256), cap=(10, 0)) is None
    assert "multiple of 32" in T.why_not(t, *_args(k=48), cap=(10, 0))
    assert "block_expert" in T.why_not(t, *_args()[:5], torch.zeros(3), False, 128, cap=(10, 0))
    assert "tile_n" in S(192, 256, 1).invalid() and "cluster_m" in S(128, 256, 4).invalid()
    assert T.why_not(t, *fc2) is not None and T._candidates(*fc2) == []   # CPU: capability 0.0
    assert T._default(*fc1) == S(256, 256, 1) and T._default(*fc2) == S(128, 256, 1)
    assert T._key(*fc2) == "rows<=512,E=4,N=512,K=512,fc2,block_m=128"
