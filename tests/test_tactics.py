"""CPU tests of torch_fp4.tactics (tactic choice, JSON cache) and the Triton GEMM's tactic space."""
import dataclasses
import json

import pytest
import torch

from torch_fp4 import formats as F
from torch_fp4 import tactics
from torch_fp4.backends import Backend
from torch_fp4.kernels.triton import mm_tactics as MT
from torch_fp4.problems import MmProblem
from torch_fp4.testing import checked_candidates


def _args(m, n=8192, k=28672, a_dtype=torch.bfloat16, fmt=F.NVFP4, fp4=False):
    a = torch.empty(m, k // 2 if fp4 else k, dtype=torch.uint8 if fp4 else a_dtype)
    b = torch.empty(n, k // 2, dtype=torch.uint8).T
    bs = torch.empty(1, dtype=torch.uint8)
    return MmProblem.of(a, b, bs if fp4 else None, bs, None, torch.bfloat16, fmt, F.SfLayout.LAYOUT_128x4)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FP4_CACHE_DIR", str(tmp_path))
    tactics.forget()
    yield tmp_path
    tactics.forget()


def test_json_round_trip_of_every_candidate():
    for m in (1, 16, 64, 128, 4096):
        for t in MT.candidates(_args(m)):
            back = tactics.tactic_from_json(json.loads(json.dumps(t.to_json())))
            assert back == t and type(back) is type(t)
    assert tactics.tactic_from_json({"family": "no_such_family"}) is None
    assert tactics.tactic_from_json({"family": "triton_mm", "block_m": 16}) is None  # missing fields


def test_candidates_are_valid_and_default_first():
    for m in (1, 8, 16, 32, 64, 128, 256, 2048):
        checked_candidates(MT, _args(m))


def test_heuristic_by_size():
    assert MT.default(_args(1)).swap_ab and MT.default(_args(1)).split_k > 1
    assert not MT.default(_args(128)).swap_ab
    assert isinstance(MT.default(_args(4096)), MT.DequantMmTactic)
    # fp16 activations with MXFP4 need the tf32 path, never the 16-bit dequantization.
    args = _args(4096, a_dtype=torch.float16, fmt=F.MXFP4)
    assert MT.dot_dtype(args) == torch.float32
    assert isinstance(MT.default(args), MT.TritonMmTactic)
    assert "fp16 activations with MXFP4" in MT.why_not(MT.DequantMmTactic(), args)


@pytest.mark.parametrize("change,msg", [
    (dict(block_k=48), "block_k=48 is not a multiple"),
    (dict(block_k=96), "block_k=96 must be a power of two"),
    (dict(block_m=8), "block_m=8 must be a power of two >= 16"),
    (dict(split_k=64), "leaves an empty K slice"),
    (dict(block_m=256, block_n=256, block_k=512, num_stages=4), "KiB of shared memory"),
])
def test_why_not_names_the_problem(change, msg):
    args = _args(16, k=4096, fmt=F.MXFP4)
    t = dataclasses.replace(MT.default(args), **change)
    assert msg in MT.why_not(t, args)


def test_key_buckets_m_and_names_dtypes():
    assert MT.key(_args(9)) == MT.key(_args(16)) != MT.key(_args(17))
    assert MT.key(_args(16, fp4=True)) != MT.key(_args(16))
    assert "mxfp4" in MT.key(_args(16, fmt=F.MXFP4))


def test_choose_forced_cached_and_heuristic(cache_dir):
    op, backend = "mm_fp4", Backend.TRITON
    args = _args(16)
    calls = []

    def launch(*a, tactic):
        calls.append(tactic)

    # no cache: the heuristic, and nothing is launched
    assert tactics.choose(op, backend, args, launch) == MT.default(args)
    # a cache file written by an earlier process is read once and used
    other = MT.candidates(args)[3]
    key = tactics.full_key(op, backend, MT.key(args), torch.device("cpu"))
    (cache_dir / "tactics.json").write_text(json.dumps({key: other.to_json()}))
    tactics.forget()
    assert tactics.choose(op, backend, args, launch) == other
    # a cached tactic that cannot run this problem falls back to the heuristic
    bad = dataclasses.replace(other, block_k=48)
    (cache_dir / "tactics.json").write_text(json.dumps({key: bad.to_json()}))
    tactics.forget()
    assert tactics.choose(op, backend, args, launch) == MT.default(args)
    # a forced tactic wins, and one that cannot run raises naming the reason
    with tactics.use_tactic(other):
        assert tactics.choose(op, backend, args, launch) == other
    with tactics.use_tactic(dataclasses.replace(other, block_m=8)):
        with pytest.raises(ValueError, match="block_m=8 must be a power of two"):
            tactics.choose(op, backend, args, launch)
    assert calls == []


def test_forced_tactic_of_another_backend_is_refused(cache_dir):
    @dataclasses.dataclass(frozen=True)
    class Other(tactics.Tactic):
        backend = Backend.CUTE_DSL
        family = "test_other"
    with tactics.use_tactic(Other()):
        with pytest.raises(ValueError, match="is for backend 'cute-dsl'"):
            tactics.choose("mm_fp4", Backend.TRITON, _args(16), lambda *a, tactic: None)


def test_triton_fused_moe_tactic_space():
    """The Triton fused_moe tactics join the tactic system: registered, the default is
    moe_gemm.default_config's tiles, every candidate valid and distinct, cache round trip, limits
    named, listed by fused_moe_tactics (explicit backend; "auto" on a CPU lists none)."""
    import torch_fp4 as t4
    from torch_fp4 import tactics as TT
    from torch_fp4 import testing as T
    from torch_fp4.backends import Backend
    from torch_fp4.kernels.triton import moe_gemm as MG
    from torch_fp4.kernels.triton import moe_tactics as MT
    from torch_fp4.problems import MoeProblem
    assert TT.space("fused_moe", Backend.TRITON) is MT.MOE_SPACE
    for tokens in (1, 16, 300):
        kw = T.moe_problem(tokens, 64, 128, 8, 2, "cpu", w4a4=False)
        p = MoeProblem.of(kw["x"], kw["w1"], kw["w1_scale"], kw["w2"], kw["w2_scale"], kw["topk_ids"], None, None,
                          0, None, torch.bfloat16)
        d = MT.default(p)
        assert d.config() == MG.default_config(tokens, 2, 8, 64, 128, 132)
        cands = t4.fused_moe_tactics(**kw, backend="triton")
        assert cands[0] == d and len(set(cands)) == len(cands) >= 4
        assert all(MT.why_not(c, p) is None for c in cands)
        assert all(TT.tactic_from_json(c.to_json()) == c for c in cands)
        assert t4.fused_moe_tactics(**kw) == []            # auto on a CPU: the reference only
    bad = MT.TritonMoeTactic(24, True, 64, 128, 64, 128)
    assert "block_m=24 must be a power of two" in MT.why_not(bad, p)
    assert "fc1_block_k=256 must be one of" in MT.why_not(MT.TritonMoeTactic(16, True, 64, 256, 64, 128), p)
    assert "leaves empty K slices" in MT.why_not(MT.TritonMoeTactic(16, True, 64, 128, 64, 128, 4), p)
    assert "not a Triton fused_moe tactic" in MT.why_not(t4.fused_moe_tactics(**kw, backend="cuda")[0], p)


def test_the_gpu_tests_fresh_tactic_cache_keeps_the_built_kernels_shared(poisoned_fresh_tactics, tmp_path):
    """The GPU modules' fixture gives each test an empty tactic cache of its own, and only that:
    the cache folder of the built cuda libraries stays the shared one, so no test worker builds
    them again (a test's temporary folder as TORCH_FP4_CACHE_DIR made every worker rebuild
    them and the quick tier took minutes longer)."""
    from torch_fp4.kernels.cuda import build

    assert tactics.cache_path() == tmp_path / "tactics.json"
    build.build_dir.cache_clear()   # computed afresh under the fixture
    try:
        assert tmp_path not in build.build_dir((9, 0)).parents
    finally:
        build.build_dir.cache_clear()
