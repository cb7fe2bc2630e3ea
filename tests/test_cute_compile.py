"""The CuTe DSL kernels compile without a GPU for sm_90a and sm_100a (CUTE_DSL_ARCH).

Each architecture compiles in its own interpreter (the DSL reads CUTE_DSL_ARCH when cutlass is
imported). Checked on the output: the PTX targets the requested architecture, the cubin is a
CUDA ELF for that SM, the TMA quantize kernel contains the bulk tensor copy
(`cp.async.bulk.tensor`) completing on an mbarrier, the vector kernel does not, and no kernel
uses an approximate instruction (`.approx`), so every reciprocal and division is correctly
rounded. Configs with pdl=True (programmatic dependent launch) contain `griddepcontrol.wait`
and `griddepcontrol.launch_dependents`; every other config contains no `griddepcontrol`.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason="nvidia-cutlass-dsl (cutlass) is not installed")

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = r"""
import json, re, struct, sys
from torch_fp4.kernels.cute import launch as L
from torch_fp4.kernels.cute.quantize_tma import tma_shape

C = L.KernelConfig
configs = []
for dtype in ("bf16", "f16", "f32", "e4m3"):
    configs.append(C("quantize", dtype, "nvfp4", "128x4", "vector"))
    configs.append(C("quantize", dtype, "mxfp4", "8x4", "tma", tma_shape(4096, dtype, 32)))
    configs.append(C("global_scale", dtype))
configs += [C("quantize", "bf16", "mxfp4", "linear", "vector"),
            C("quantize", "f16", "nvfp4", "linear", "tma", tma_shape(64, "f16", 16)),
            C("dequantize", "bf16", "nvfp4", "128x4", has_gs=True),
            C("dequantize", "f32", "mxfp4", "8x4"),
            C("dequantize", "f16", "nvfp4", "linear")]
configs += [C("quantize", "bf16", "nvfp4", "128x4", "vector", pdl=True),
            C("quantize", "f32", "mxfp4", "8x4", "tma", tma_shape(4096, "f32", 32), pdl=True),
            C("global_scale", "bf16", pdl=True),
            C("dequantize", "bf16", "nvfp4", "128x4", has_gs=True, pdl=True)]
out = []
for cfg in configs:
    fn = L.compile_only(cfg)
    ptx, cubin = fn.__ptx__, fn.__cubin__
    flags = struct.unpack_from("<I", cubin, 48)[0]
    out.append({
        "config": repr(cfg),
        "variant": cfg.variant,
        "target": re.search(r"\.target\s+(\S+)", ptx).group(1),
        "elf": cubin[:4] == b"\x7fELF" and struct.unpack_from("<H", cubin, 18)[0] == 190,
        "sm": [flags & 0xFF, (flags >> 8) & 0xFF],
        "bulk_tensor": "cp.async.bulk.tensor" in ptx,
        "mbarrier_wait": "mbarrier.try_wait" in ptx,
        "approx": ".approx" in ptx,
        "pdl": cfg.pdl,
        "gdc_wait": "griddepcontrol.wait" in ptx,
        "gdc_launch": "griddepcontrol.launch_dependents" in ptx,
        "gdc_any": "griddepcontrol" in ptx,
    })
print(json.dumps(out))
"""


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_cute_kernels_compile_for_arch(arch, tmp_path):
    # PTX/cubin dumps of --keep-ptx/--keep-cubin land in CUTE_DSL_DUMP_DIR.
    env = dict(os.environ, CUTE_DSL_ARCH=arch, CUTE_DSL_DUMP_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 21
    assert sum(r["pdl"] for r in results) == 4
    sm = int(arch[3:-1])
    for r in results:
        assert r["target"] == arch, r
        assert r["elf"] and sm in r["sm"], r
        assert not r["approx"], r
        if r["pdl"]:
            assert r["gdc_wait"] and r["gdc_launch"], r
        else:
            assert not r["gdc_any"], r
        if r["variant"] == "tma":
            assert r["bulk_tensor"] and r["mbarrier_wait"], r
        else:
            assert not r["bulk_tensor"], r
