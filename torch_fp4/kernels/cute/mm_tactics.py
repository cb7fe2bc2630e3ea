"""Tactics of the CuTe DSL FP4 GEMM (mm_fp4, W4A4): data only, cheap to import (no cutlass).

Two kernel families, one kernel class each, parametrized by these frozen dataclasses:
- `Sm100MmTactic` (family "cute_mm_tcgen05"): tcgen05 block-scaled MMA (sm_100a / sm_103a),
  tile (tile_m, tile_n, tile_k) per MMA (tile_m 256 = a 2-CTA pair, `tcgen05.mma.cta_group::2`;
  tile_n 192 stages 256 rows of B's scale factors, see mm_blockscaled.BlockScaledGemmSm100)
  and a cluster (cluster_m, cluster_n) over which A/B tiles are TMA-multicast.
- `Sm120MmTactic` (family "cute_mm_sm120"): warp-level `mma.sync ... block_scale` (sm_12x),
  tile (tile_m, tile_n, tile_k) per CTA and a scheduler: "data_parallel" (one CTA per output
  tile) or "stream_k" (a persistent grid splits the K iterations of all tiles evenly; partial
  tiles are summed in a fixed order through a workspace, so results stay deterministic).

Dispatch by compute capability, minor version included: 10.0 -> SM100_TACTICS; 10.3 ->
SM103_TACTICS + SM100_TACTICS (the 768-deep K tiles of FlashInfer's SM103 tactics: 128x128,
128x192 and 128x256); 12.x -> SM120_TACTICS (128x128x128, 128x128x256, 256x128x128). These
kernels are compiled and SASS-checked in CI but have never run (compiled, not run): no
Blackwell GPU was available (see torch_fp4/kernels/cute/mm_blockscaled.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from ...backends import Backend
from ...problems import MmProblem
from ...tactics import Tactic, TacticSpace, register_family
from .._common import problem_sm_count

DATA_PARALLEL = "data_parallel"
STREAM_K = "stream_k"


@register_family
@dataclass(frozen=True)
class Sm100MmTactic(Tactic):
    """tcgen05 block-scaled GEMM: MMA tile (tile_m x tile_n x tile_k) and cluster shape."""
    backend: ClassVar[Backend] = Backend.CUTE_DSL
    family: ClassVar[str] = "cute_mm_tcgen05"
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 256
    cluster_m: int = 1
    cluster_n: int = 1

    @property
    def two_cta(self) -> bool:
        return self.tile_m == 256

    def invalid(self) -> Optional[str]:
        """Why this tactic is not a valid kernel configuration at all (None when it is)."""
        if self.tile_m not in (128, 256):
            return f"tile_m must be 128 or 256 (2-CTA), got {self.tile_m}"
        if self.tile_n not in (128, 192, 256):
            return f"tile_n must be 128, 192 or 256, got {self.tile_n}"
        if self.tile_n == 192 and (self.tile_m != 128 or self.cluster_n != 1):
            # The 192-row B tile's scale factors are loaded as a 256-row box whose start
            # depends on the N tile's parity; offered (and compiled) for 1-CTA tiles with
            # clusters along M only, where every CTA of a cluster has the same N tile and so
            # receives the same multicast SFB box.
            return (f"tile_n=192 needs tile_m=128 and cluster_n=1, got tile_m={self.tile_m} "
                    f"cluster_n={self.cluster_n}")
        if self.tile_k not in (256, 768):
            return f"tile_k must be 256 or 768, got {self.tile_k}"
        if self.cluster_m not in (1, 2, 4) or self.cluster_n not in (1, 2):
            return f"cluster {self.cluster_m}x{self.cluster_n} not in {{1,2,4}}x{{1,2}}"
        if self.two_cta and self.cluster_m % 2:
            return "a 2-CTA tile (tile_m=256) needs an even cluster_m"
        return None


@register_family
@dataclass(frozen=True)
class Sm120MmTactic(Tactic):
    """sm_12x warp-MMA block-scaled GEMM: CTA tile and tile scheduler."""
    backend: ClassVar[Backend] = Backend.CUTE_DSL
    family: ClassVar[str] = "cute_mm_sm120"
    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 128
    scheduler: str = DATA_PARALLEL

    def invalid(self) -> Optional[str]:
        if (self.tile_m, self.tile_n, self.tile_k) not in SM120_TILES:
            return f"tile {self.tile_m}x{self.tile_n}x{self.tile_k} not in {SM120_TILES}"
        if self.scheduler not in (DATA_PARALLEL, STREAM_K):
            return f"scheduler must be {DATA_PARALLEL!r} or {STREAM_K!r}, got {self.scheduler!r}"
        return None


T100 = Sm100MmTactic
SM100_TACTICS = (
    T100(128, 128, 256, 1, 1), T100(128, 128, 256, 2, 1), T100(128, 128, 256, 1, 2),
    T100(128, 256, 256, 1, 1), T100(128, 256, 256, 2, 1),
    T100(256, 128, 256, 2, 1), T100(256, 256, 256, 2, 1), T100(256, 128, 256, 4, 1),
)
# SM103 (B300): the 768-deep K tiles of FlashInfer's SM103 tactics with 1x1, 2x1 and 4x1
# clusters.
SM103_TACTICS = tuple(T100(128, n, 768, cm, 1) for n in (128, 192, 256) for cm in (1, 2, 4))
# tile_m 256 repeats the 128-row MMA permutation twice along M (see mm_blockscaled_sm120).
SM120_TILES = ((128, 128, 128), (128, 128, 256), (256, 128, 128))
SM120_TACTICS = tuple(Sm120MmTactic(*tile, sched) for tile in SM120_TILES
                      for sched in (DATA_PARALLEL, STREAM_K))


def tactics_for_capability(cap: tuple[int, int]) -> tuple[Tactic, ...]:
    """Every tactic the kernels offer on a device of compute capability `cap`."""
    if cap == (10, 0):
        return SM100_TACTICS
    if cap == (10, 3):
        return SM103_TACTICS + SM100_TACTICS
    if cap[0] == 12:
        return SM120_TACTICS
    return ()


def _pow2_bucket(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _why_not(tactic: Tactic, p: MmProblem) -> Optional[str]:
    """Why `tactic` cannot run problem `p` on its device; the problem-level limits (W4A4,
    row-major weights, 128x4 activation scales, K % 32, sizes) are the backend's requirement."""
    cap = p.capability
    if tactic not in tactics_for_capability(cap):
        return (f"{tactic.label()} is not a tactic of compute capability {cap[0]}.{cap[1]} "
                f"(10.0: SM100 tiles; 10.3: SM103 + SM100 tiles; 12.x: SM120 tiles)")
    return tactic.invalid()


def _candidates(p: MmProblem) -> list:
    return [t for t in tactics_for_capability(p.capability) if _why_not(t, p) is None]


def default_for(cap: tuple[int, int], m: int, n: int, k: int, sm_count: int = 148) -> Tactic:
    """The heuristic tactic (no timing): the simplest configuration that fills the GPU.

    tcgen05: 1-CTA tiles without clusters are the default (the 2-CTA and multicast paths are
    offered to the autotuner only); 128x256 once the 128x128 grid already has two waves.
    sm_12x: 128x128x128 data-parallel, or stream-K when the output tiles fill less than half
    the SMs and each tile has at least 8 K-iterations to share.
    """
    if cap[0] == 12:
        tiles = -(-m // 128) * -(-n // 128)
        if tiles * 2 <= sm_count and k >= 8 * 128:
            return Sm120MmTactic(128, 128, 128, STREAM_K)
        return Sm120MmTactic(128, 128, 128, DATA_PARALLEL)
    tiles_128 = -(-m // 128) * -(-n // 128)
    if n >= 256 and tiles_128 >= 2 * sm_count:
        return T100(128, 256, 256, 1, 1)
    return T100(128, 128, 256, 1, 1)


def _default(p: MmProblem) -> Tactic:
    return default_for(p.capability, p.m, p.n, p.k, problem_sm_count(p, 148))


def _key(p: MmProblem) -> str:
    return (f"M<={_pow2_bucket(p.m)},N={p.n},K={p.k},{p.fmt.name},{str(p.a_dtype).replace('torch.', '')},"
            f"{str(p.out_dtype).replace('torch.', '')},{p.sf_layout.value}")


MM_SPACE = TacticSpace(candidates=_candidates, default=_default, key=_key, why_not=_why_not)
