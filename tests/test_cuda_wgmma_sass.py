"""The Hopper wgmma GEMM (torch_fp4/csrc/mm_wgmma.cu) compiles for sm_90a without a GPU, with
HGMMA reading the decoded weights from registers (A) and the TMA activation tile from shared
memory (B), for every wgmma N and both 16-bit types, one or two K groups, no register spills, and
no ptxas serialization of the wgmmas (warning C7513); one pass of each main loop runs one stage,
8 HGMMAs where mm_wgmma_tactics.stage_k is 128 K and 4 where it is 64 (the kernel's stage_subs
mirrored); the main loop on "sm90" weights at least 15% shorter per HGMMA than on row-major ones,
and with two K groups no longer than with one and free of R2UR (descriptors in uniform
registers); the split-2 kernels at every block_m from 128 with main loops as short as the others';
every mbarrier wait sleeps on a suspend-time hint between phase checks; the kernels whose stages
hold two sub-tiles form the multipliers in the producer's converting warps (NVFP4 by the e4m3
conversion instruction) and read at most 1.5 shared-memory words per HGMMA in the main loop. It compiles to
a stub for sm_100a (wgmma is Hopper-only).
Skipped without nvcc or a disassembler."""
import re
import subprocess

import pytest

import sass_tools
from sass_tools import disassemble, have_disassembler
from test_cuda_sources_compile import NVCC
from torch_fp4.kernels.cuda import build
from torch_fp4.kernels.cuda import mm_wgmma_tactics as WT


def _compile(tmp_path, cap):
    if NVCC is None:
        pytest.skip("nvcc not found (PATH, CUDA_HOME or /usr/local/cuda)")

    out = tmp_path / f"mm_wgmma_{build.arch_target(cap)}.cubin"
    cmd = [NVCC, "-cubin", *build.nvcc_flags(NVCC), build.gencode_flag(cap), "-Xptxas", "-v",
           "-o", str(out), str(build.CSRC / "mm_wgmma.cu")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out.read_bytes(), proc.stderr


def test_sm90a_register_a_hgmma_no_spills_no_serialization(tmp_path):
    if not have_disassembler():
        pytest.skip("no nvdisasm / cuobjdump")
    cubin, log = _compile(tmp_path, (9, 0))
    assert "C7513" not in log, "ptxas serialized the wgmmas"
    assert re.findall(r"(\d+) bytes spill stores", log) and all(
        v == "0" for v in re.findall(r"(\d+) bytes spill stores", log)), log
    sass = disassemble(cubin)
    # fp16 inputs print without a type suffix (HGMMA.64xNx16.F32), bf16 as .F32.BF16.
    hgmma = re.findall(r"HGMMA\.64x(\d+)x16\.F32(\.BF16)? R\d+, (\S+), (\S+), ", sass)
    assert {(n, t) for n, t, _, _ in hgmma} == {(str(n), t) for n in WT.BLOCK_MS for t in (".BF16", "")}
    assert all(re.fullmatch(r"R\d+", a) for _, _, a, _ in hgmma), "A operand must come from registers"
    assert all(b.startswith("gdesc[") for _, _, _, b in hgmma), "B operand must come from shared memory"
    # Every wait keeps three k16 steps in flight, seven in the kernels of Config::kInFlight 7 (no wgmma
    # is waited for right after its issue).
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", sass)
    deep = waits.count("0x7")
    assert waits and set(waits) <= {"0x3", "0x7", "0x0"} and deep > 0, sorted(set(waits))
    assert waits.count("0x3") + deep >= 4 * waits.count("0x0"), waits
    assert "UTMALDG" in sass and "UBLKCP" in sass   # TMA tiles and the bulk scale copy
    # Two K groups (Config<..., kCtas 1, kKG 2>) at block_m 32 and 64 only, 640 threads' registers.
    two = set(re.findall(r"ConfigILi(\d+)ELb\dELb\dELb\dELi1ELi2E", sass))
    assert two == {"32", "64"}, two
    # The persistent epilogue of 16-bit outputs: transposed stmatrix into the swizzled buffer, then
    # a TMA tensor store.
    assert re.search(r"STSM\.16\.MT88\.4", sass) and "UTMASTG" in sass
    # Every mbarrier wait sleeps between phase checks (try_wait's suspend-time hint): each retry
    # of a failed TRYWAIT is a NANOSLEEP.SYNCS and a phase check, never a bare polling loop.
    sleeps = len(re.findall(r"NANOSLEEP\.SYNCS", sass))
    rechecks = len(re.findall(r"SYNCS\.PHASECHK\.TRANS64 P\d", sass))
    assert sleeps > 0 and sleeps == rechecks, (sleeps, rechecks)


def test_sm100a_compiles_to_a_stub(tmp_path):
    cubin, _ = _compile(tmp_path, (10, 0))
    if have_disassembler():
        assert "HGMMA" not in disassemble(cubin)


def _kernels(sass: str) -> dict:
    """cuobjdump's SASS of each kernel instantiation, keyed by its Config template arguments
    (block_m, fp16, mx, sm90 layout, CTAs per SM, K groups, split-2 kernel)."""
    out = {}
    for func in re.split(r"\n\s*Function : ", sass)[1:]:
        cfg = re.search(r"ConfigILi(\d+)ELb(\d)ELb(\d)ELb(\d)ELi(\d)ELi(\d)ELb(\d)E", func.split("\n")[0])
        if cfg is not None:
            out[tuple(int(v) for v in cfg.groups())] = func
    return out


def _main_loops(sass: str) -> dict:
    """The main loop (instructions of one K stage) of each kernel instantiation (keys as _kernels):
    the shortest backward-branch loop holding at least four HGMMAs."""
    out = {}
    for cfg, func in _kernels(sass).items():
        ins = [(int(a, 16), body.split(";")[0]) for a, body in re.findall(r"/\*([0-9a-f]{4,})\*/\s*([^\n]*)", func)]
        loops = []
        for addr, body in ins:
            target = re.search(r"BRA[^;]* (0x[0-9a-f]+)", body)
            if target and int(target.group(1), 16) < addr:
                loop = [b for a, b in ins if int(target.group(1), 16) <= a <= addr]
                if sum("HGMMA" in b for b in loop) >= 4:
                    loops.append(loop)
        out[cfg] = min(loops, key=len)
    return out


def test_main_loops_sm90_layout_and_two_k_groups(tmp_path):
    cuobjdump = sass_tools._tool("cuobjdump")   # numeric branch targets (nvdisasm prints labels)
    if cuobjdump is None:
        pytest.skip("no cuobjdump")
    cubin, _ = _compile(tmp_path, (9, 0))
    path = tmp_path / "sm90.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run([cuobjdump, "-sass", str(path)], check=True, capture_output=True, text=True).stdout
    loops = _main_loops(sass)
    for (bm, _, _, packed, ctas, _, _), loop in loops.items():
        steps = sum("HGMMA" in b for b in loop)
        assert steps == 4 * WT.stage_k(bm, ctas, bool(packed)) // WT.BLOCK_K, (bm, packed, ctas, steps)

    def per_step(cfg):
        return len(loops[cfg]) / sum("HGMMA" in b for b in loops[cfg])
    for bm in (64, 128, 256):
        row, sm90 = per_step((bm, 0, 0, 0, 1, 1, 0)), per_step((bm, 0, 0, 1, 1, 1, 0))   # bf16 NVFP4
        assert sm90 <= 0.85 * row, (bm, row, sm90)
    # Two K groups: each warp's stage costs what one K group's does (the same decode, lookahead and
    # ring bookkeeping), with the stage addresses and wgmma descriptors in uniform registers (no
    # R2UR per wgmma: K group index broadcast warp-uniform).
    for bm in (32, 64):
        for fp16, mx in ((0, 0), (1, 0), (0, 1)):
            one, two = (bm, fp16, mx, 1, 1, 1, 0), (bm, fp16, mx, 1, 1, 2, 0)
            assert per_step(two) <= per_step(one) + 2, (bm, fp16, mx, per_step(one), per_step(two))
            assert not any("R2UR" in b for b in loops[two]), (bm, fp16, mx)
    # The split-2 kernels (Config's kPair) exist at every block_m from 128 with one K group and one CTA
    # per SM, for every variant, and their main loops are as short as the one-tile kernels' (the
    # epilogue of their own leaves ptxas's main loop alone).
    pairs = {cfg[:6] for cfg in loops if cfg[6]}
    wide = [bm for bm in WT.BLOCK_MS if bm >= 128]
    assert {(c[0], c[4], c[5]) for c in pairs} == {(bm, 1, 1) for bm in wide}, pairs
    assert len(pairs) == len(wide) * len({cfg[1:4] for cfg in loops}), pairs
    for cfg in pairs:
        assert len(loops[cfg + (1,)]) <= len(loops[cfg + (0,)]) + 4, (cfg, len(loops[cfg + (1,)]), len(loops[cfg + (0,)]))
    # Stages of two sub-tiles (Config's kConvert): the producer's converting warps form the
    # multipliers, NVFP4 by the hardware's e4m3 conversion (in exactly those kernels), and the MMA
    # threads' main loop reads only weight words and one 8-byte word of multipliers per half sub-tile:
    # at most 1.5 shared-memory reads per HGMMA, against 3 or more with the scale-table reads.
    convert = {cfg: "F2FP.F16.E4M3.UNPACK_B" in func for cfg, func in _kernels(sass).items()}
    assert convert.keys() == loops.keys()
    for (bm, fp16, mx, packed, ctas, kg, pair), loop in loops.items():
        two = WT.stage_k(bm, ctas, bool(packed)) == 2 * WT.BLOCK_K
        assert convert[(bm, fp16, mx, packed, ctas, kg, pair)] == (two and not mx), (bm, fp16, mx, packed, ctas)
        reads = sum(bool(re.match(r"\s*(@!?U?P\d+\s+)?LDS", b)) for b in loop) / sum("HGMMA" in b for b in loop)
        assert (reads <= 1.5) == two, (bm, fp16, mx, packed, ctas, kg, pair, reads)

