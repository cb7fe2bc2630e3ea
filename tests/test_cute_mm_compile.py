"""The CuTe DSL FP4 GEMM (mm_fp4, W4A4) compiles for sm_100a, sm_103a and sm_120a with no GPU,
and its SASS holds the block-scaled MMA. These kernels are compiled and SASS-checked in CI,
never run: no Blackwell GPU was available.

Compiled (one interpreter per architecture, CUTE_DSL_ARCH), bf16 out with alpha: every tactic
of SM100_TACTICS on sm_100a, SM103_TACTICS on sm_103a (tiles 128x128x768, 128x192x768 and
128x256x768, clusters 1x1/2x1/4x1) and SM120_TACTICS on sm_120a (tiles 128x128x128,
128x128x256 and 256x128x128, data-parallel and stream-K) for NVFP4; for MXFP4 a representative
subset, the first tactic of each tile shape (`_mxfp4_subset`: the format changes the scale
layouts, which depend on the tile shape only, not the cluster or the scheduler); plus
fp16/fp32 outputs without alpha on one tactic per family. About 1.3 s per kernel, 39 kernels.
Checked: PTX `.target`, `kind::mxf4nvf4` + `block_scale` (tcgen05 NVFP4 `.block16`,
MXFP4 `.block32`; sm_120 NVFP4 `kind::mxf4nvf4 ... scale_vec::4X`, MXFP4 `kind::mxf4 ...
scale_vec::2X` since CuTe DSL maps 32-element blocks to kind::mxf4 there), and the SASS:
- sm_100a/sm_103a: `UTCOMMA[.2CTA][.4X|.BLOCK16] gdesc, gdesc, tmem(acc), tmem(SFA),
  idesc, tmem(SFB)` (the block-scaled form: two tensor-memory scale operands; NVFP4 shows
  `.4X` on sm_100a and `.BLOCK16` on sm_103a, MXFP4 no modifier) and `UTCCP` (tcgen05.cp of
  the scale factors into tensor memory);
- sm_120a: `OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X` (NVFP4) / `OMMA.SF.16864.F32.E2M1.E2M1.E8`
  (MXFP4).
The CPU tests check the tactic lists, why_not reasons, key stability and the JSON round trip.
"""
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_fp4 import formats as F
from torch_fp4.kernels.cute import mm_tactics as T
from torch_fp4.problems import MmProblem
from torch_fp4.tactics import tactic_from_json

ROOT = Path(__file__).resolve().parents[1]
HAVE_CUTLASS = importlib.util.find_spec("cutlass") is not None

_SCRIPT = r"""
import json, re, sys
sys.path.insert(0, sys.argv[2])
from sass_tools import disassemble, have_disassembler
from torch_fp4.kernels.cute import mm_blockscaled as M
from torch_fp4.kernels.cute import mm_tactics as T
from torch_fp4.tactics import tactic_from_json
arch = sys.argv[1]
keys = [M.MmKey(tactic_from_json(t), fmt, out, alpha, arch) for t, fmt, out, alpha in json.loads(sys.argv[3])]
out = []
for key in keys:
    fn = M.compile_only(key)
    ptx, cubin = fn.__ptx__, fn.__cubin__
    sass = disassemble(cubin) if have_disassembler() else ""
    mma = sorted(set(re.findall(r"(?:tcgen05\.mma|mma\.sync)[\w.:]*", ptx)))
    out.append({"key": repr(key), "fmt": key.fmt, "tactic": key.tactic.label(),
                "target": re.search(r"\.target\s+(\S+)", ptx).group(1), "ptx_mma": mma,
                "sass_mma": sorted(set(re.findall(r"\b(?:UTC\w*MMA|OMMA|QMMA)[\w.]*[^;]*", sass))),
                "utccp": "UTCCP" in sass, "have_sass": bool(sass)})
print(json.dumps(out))
"""

_TCGEN05_SASS = re.compile(r"UTCOMMA(\.2CTA)?(\.4X|\.BLOCK16)?\s+gdesc\[\w+\], gdesc\[\w+\], "
                           r"tmem\[\w+\], tmem\[\w+\], idesc\[\w+\], tmem\[\w+\]")


TACTICS = {"sm_100a": T.SM100_TACTICS, "sm_103a": T.SM103_TACTICS, "sm_120a": T.SM120_TACTICS}


def _mxfp4_subset(tactics):
    """The first tactic of each tile shape."""
    first = {}
    for t in tactics:
        first.setdefault((t.tile_m, t.tile_n, t.tile_k), t)
    return list(first.values())


def _compiled_keys(arch):
    """(tactic JSON, format, out dtype, alpha?) of every kernel compiled for `arch`."""
    tactics = TACTICS[arch]
    keys = [(t, "nvfp4", "bf16", True) for t in tactics]
    keys += [(t, "mxfp4", "bf16", True) for t in _mxfp4_subset(tactics)]
    keys += [(tactics[0], "nvfp4", "f16", False), (tactics[0], "mxfp4", "f32", False)]
    return [(t.to_json(), fmt, out, alpha) for t, fmt, out, alpha in keys]


@pytest.mark.skipif(not HAVE_CUTLASS, reason="nvidia-cutlass-dsl (cutlass) is not installed")
@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a", "sm_120a"])
def test_mm_kernels_compile_with_block_scaled_mma(arch, tmp_path):
    env = dict(os.environ, CUTE_DSL_ARCH=arch, CUTE_DSL_DUMP_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    keys = _compiled_keys(arch)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, arch, str(ROOT / "tests"), json.dumps(keys)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(keys)
    labels = {(r["tactic"], r["fmt"]) for r in results}
    for t in TACTICS[arch]:     # every tactic compiled, the new tiles in both formats
        assert (t.label(), "nvfp4") in labels, t
    for t in _mxfp4_subset(TACTICS[arch]):
        assert (t.label(), "mxfp4") in labels, t
    for r in results:
        assert r["target"] == arch, r
        ptx = " ".join(r["ptx_mma"])
        assert "block_scale" in ptx, r
        if arch == "sm_120a":
            want = ("kind::mxf4nvf4.block_scale.scale_vec::4X" if r["fmt"] == "nvfp4"
                    else "kind::mxf4.block_scale.scale_vec::2X")
            assert want in ptx and "m16n8k64" in ptx, r
        else:
            assert "tcgen05.mma" in ptx and "kind::mxf4nvf4" in ptx, r
            assert (".block16" if r["fmt"] == "nvfp4" else ".block32") in ptx, r
            assert ("cta_group::2" in ptx) == ("tile_m=256" in r["tactic"]), r
        if not r["have_sass"]:
            continue
        sass = " ".join(r["sass_mma"])
        if arch == "sm_120a":
            want = ("OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X" if r["fmt"] == "nvfp4"
                    else "OMMA.SF.16864.F32.E2M1.E2M1.E8")
            assert want in sass, r
        else:
            assert any(_TCGEN05_SASS.search(s) for s in r["sass_mma"]), r
            assert r["utccp"], r


# ---------------------------------------------------------------------------------------------
# CPU: tactic lists, why_not, keys, JSON
# ---------------------------------------------------------------------------------------------
def _args(m=300, n=200, k=512, fmt=F.NVFP4, layout=F.SfLayout.LAYOUT_128x4, with_scale=True, cap=None):
    """An mm_fp4 problem of CPU tensors, on a device of compute capability `cap` if given."""
    a = torch.zeros(m, k // 2, dtype=torch.uint8)
    b = torch.zeros(n, k // 2, dtype=torch.uint8).T
    kb = k // fmt.block_size
    a_scale = torch.zeros(*F.padded_scale_shape(m, kb, layout), dtype=torch.uint8) if with_scale else None
    b_scale = torch.zeros(*F.padded_scale_shape(n, kb, "128x4"), dtype=torch.uint8).T
    p = MmProblem.of(a, b, a_scale, b_scale, None, torch.bfloat16, fmt, layout)
    return p if cap is None else p.on(cap)


def test_tactic_lists_by_capability():
    sm100 = T.tactics_for_capability((10, 0))
    sm103 = T.tactics_for_capability((10, 3))
    sm120 = T.tactics_for_capability((12, 0))
    assert sm100 == T.SM100_TACTICS and all(t.tile_k == 256 for t in sm100)
    assert set(sm100) < set(sm103)
    deep = {(t.tile_m, t.tile_n, t.tile_k) for t in sm103 if t.tile_k == 768}
    assert deep == {(128, 128, 768), (128, 192, 768), (128, 256, 768)}
    for tile in deep:
        assert {(t.cluster_m, t.cluster_n) for t in sm103
                if (t.tile_m, t.tile_n, t.tile_k) == tile} == {(1, 1), (2, 1), (4, 1)}
    assert (256, 128, 128) in T.SM120_TILES
    assert not any(t.tile_k == 768 for t in sm100)
    assert {(t.tile_m, t.tile_n) for t in sm100} >= {(128, 128), (128, 256), (256, 128)}
    assert any(t.two_cta and t.cluster_m == 2 for t in sm100)
    assert T.tactics_for_capability((12, 1)) == sm120
    assert {(t.tile_m, t.tile_n, t.tile_k) for t in sm120} == set(T.SM120_TILES)
    for tile in T.SM120_TILES:
        assert {t.scheduler for t in sm120 if (t.tile_m, t.tile_n, t.tile_k) == tile} == {
            T.DATA_PARALLEL, T.STREAM_K}
    assert T.tactics_for_capability((9, 0)) == () and T.tactics_for_capability((10, 1)) == ()
    for t in sm103 + sm120:
        assert t.invalid() is None, t


def test_why_not_reasons():
    """A tactic's own limits: offered on the device's capability, a valid configuration."""
    args = _args()
    t100, t103, t120 = T.SM100_TACTICS[0], T.SM103_TACTICS[0], T.SM120_TACTICS[0]
    assert T._why_not(t100, args.on((10, 0))) is None
    assert T._why_not(t103, args.on((10, 3))) is None
    assert T._why_not(t100, args.on((10, 3))) is None
    assert "capability 10.0" in T._why_not(t103, args.on((10, 0)))
    assert T._why_not(t120, args.on((12, 0))) is None
    assert "capability 12.0" in T._why_not(t100, args.on((12, 0)))
    assert T.Sm100MmTactic(128, 192, 768, 4, 1).invalid() is None
    assert T._why_not(T.Sm100MmTactic(128, 192, 768), _args(n=200, cap=(10, 3))) is None
    assert "capability 10.0" in T._why_not(T.Sm100MmTactic(128, 192, 768), args.on((10, 0)))
    assert "tile_n" in T.Sm100MmTactic(128, 160, 256).invalid()
    assert "tile_n=192 needs tile_m=128" in T.Sm100MmTactic(256, 192, 768, 2, 1).invalid()
    assert "cluster_n=1" in T.Sm100MmTactic(128, 192, 768, 1, 2).invalid()
    assert T._why_not(T.Sm120MmTactic(256, 128, 128, T.STREAM_K), args.on((12, 0))) is None
    assert "not in" in T.Sm120MmTactic(256, 256, 128).invalid()
    assert "capability 10.0" in T._why_not(T.Sm120MmTactic(256, 128, 128), args.on((10, 0)))
    assert "even cluster_m" in T.Sm100MmTactic(256, 128, 256, 1, 1).invalid()
    assert "scheduler" in T.Sm120MmTactic(128, 128, 128, "split_k").invalid()
    # On a CPU tensor no tactic applies (capability 0.0).
    assert T._why_not(t100, args) is not None and T._candidates(args) == []


def test_problem_limits_are_the_requirement():
    """W4A4, row-major weights, 128x4 activation scales, K % 32 and sizes: the backend's
    requirement states them once (no tactic re-checks them)."""
    from torch_fp4.kernels.cute import requirement

    cuda = dict(device=torch.device("cuda", 0))
    on_gpu = lambda **kw: dataclasses.replace(_args(cap=(10, 0), **kw), **cuda)   # noqa: E731
    assert "multiple of 32" in requirement("mm_fp4", on_gpu(k=48))
    assert "W4A4" in requirement("mm_fp4", on_gpu(with_scale=False))
    assert "128x4" in requirement("mm_fp4", on_gpu(layout=F.SfLayout.LAYOUT_8x4))
    assert "empty problem" in requirement("mm_fp4", on_gpu(m=0))
    row = on_gpu()
    assert "row-major" in requirement("mm_fp4", dataclasses.replace(row, weight_layout=F.WeightLayout.SM90))
    assert "compute capability 10.0, 10.3 or 12.x" in requirement("mm_fp4", row.on((9, 0)))
    reason = requirement("mm_fp4", row)
    assert reason is None or "cutlass" in reason    # the package check comes last


def test_default_heuristic():
    assert T.default_for((10, 0), 64, 4096, 4096) in T.SM100_TACTICS
    assert T.default_for((10, 3), 8192, 8192, 8192, 148) == T.Sm100MmTactic(128, 256, 256)
    assert T.default_for((12, 0), 128, 128, 8192, 170).scheduler == T.STREAM_K
    assert T.default_for((12, 0), 8192, 8192, 1024, 170).scheduler == T.DATA_PARALLEL


def test_key_stable_and_bucketed():
    k1 = T._key(_args(m=300))
    assert k1 == T._key(_args(m=300)) == T._key(_args(m=500))
    assert k1 == "M<=512,N=200,K=512,nvfp4,uint8,bfloat16,128x4"
    assert T._key(_args(m=513)) != k1
    assert T._key(_args(fmt=F.MXFP4)) != k1


def test_json_round_trip():
    for t in T.SM100_TACTICS + T.SM103_TACTICS + T.SM120_TACTICS:
        back = tactic_from_json(json.loads(json.dumps(t.to_json())))
        assert back == t and type(back) is type(t)


def test_requirement_reasons_on_cpu():
    from torch_fp4.kernels.cute import OPS, TACTIC_SPACES, requirement
    assert OPS["mm_fp4"] == "mm_blockscaled:mm_fp4"
    assert TACTIC_SPACES["mm_fp4"] == "mm_tactics:MM_SPACE"
    assert "CUDA" in requirement("mm_fp4", _args())
