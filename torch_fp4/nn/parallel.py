"""Tensor- and expert-parallel FP4 modules over a torch.distributed process group.

Each module keeps this rank's shard of an FP4Linear or FP4MoE, cut from the whole module's bytes
(no requantization: FP4 blocks run along K, so a shard whose K range is a whole number of blocks
holds exactly the codes and block scales that quantizing it with the same global scale gives),
and combines the ranks' results with functional collectives (torch.distributed.
_functional_collectives), which torch.compile(fullgraph=True) traces; nothing reads a tensor on
the host, so CUDA graphs can capture them. Partial results are reduced in fp32 and rounded to
the output dtype once.

- TensorParallelFP4Linear, style "column": rows [r N/w, (r+1) N/w) of the weight (and bias);
  forward(x) -> this rank's output columns, or all of them with gather_output=True.
- TensorParallelFP4Linear, style "row": K columns [r K/w, (r+1) K/w) (K / w a multiple of the
  block size, 16 for NVFP4 and 32 for MXFP4, else an error: a block cut in two would be silent
  garbage); forward(x) takes this rank's K slice (input_is_parallel=True, as a column-parallel
  layer without gather gives it) or the whole x, and all-reduces the fp32 partial products, bias
  added to the fp32 sum before its one rounding (as FP4Linear adds it). W4A4 row shards need a
  fixed activation scale (calibrate first): a per-call scale computed over a K slice would differ
  between ranks.
- ExpertParallelFP4MoE (of an FP4MoE, or of a transformers block's FP4SparseMoeBlock, whose
  forward, routing, return structure and shared experts it keeps): experts [r E/w, (r+1) E/w).
  tokens="replicated": every rank holds every token, routes them with the whole router (the same
  ids and weights on every rank), runs fused_moe over its experts (pairs routed elsewhere add
  zero) with an fp32 output, and all-reduces. tokens="sharded" (an FP4MoE): each rank brings
  its own tokens (the same count everywhere); they are all-gathered, routed and run as above,
  and a reduce-scatter returns each rank the sums for its tokens. With top_k = 2 and two ranks
  both are bit-identical to the single FP4MoE; in general the fp32 sum over a token's k slots is
  regrouped by rank. An all-to-all dispatch of each token to the ranks holding its experts (less
  traffic at large T) is not implemented.
- TensorParallelFP4MoE: every expert's intermediate columns [r I/w, (r+1) I/w) (I / w a multiple
  of the block size): FC1's gate and up rows and FC2's K columns; each rank's fused_moe output is
  a partial sum over its slice of the intermediate, all-reduced in fp32.

Process groups: any torch.distributed group (gloo on the CPU, NCCL on GPUs); world size and rank
are read from it when the module is built.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from .. import formats as F
from .. import ops
from ..ops import _checks as C
from ._common import _input, _widen, keep_state_row_major
from .linear import FP4Linear
from .moe import FP4MoE

__all__ = ["TensorParallelFP4Linear", "ExpertParallelFP4MoE", "TensorParallelFP4MoE", "shard_fp4_linear"]

_LAYOUT = F.SfLayout.LAYOUT_128x4


def _group_info(op: str, group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        C.fail(op, "group", "an initialized torch.distributed process group", "no process group", RuntimeError)
    group = group if group is not None else dist.group.WORLD
    return dist.get_rank(group), dist.get_world_size(group)


def _split(op: str, name: str, size: int, world: int, block: int, why: str) -> int:
    """The per-rank share of `size`, which must split into whole multiples of `block`."""
    if size % world or (size // world) % block:
        C.fail(op, name, f"a size that splits over {world} ranks into multiples of {block} ({why})", size)
    return size // world


# all_gather_single replaces all_gather_tensor (deprecated) in newer torch; same arguments
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor


def _all_reduce(t: torch.Tensor, group, op: str = "sum") -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_reduce(t, op, group))


def _rows(scale: torch.Tensor, rows: int, k_blocks: int) -> torch.Tensor:
    """128x4 scales [Np, Kp] -> [rows, k_blocks] bytes."""
    return F.unswizzle(scale.view(torch.uint8), rows, k_blocks, _LAYOUT)


def shard_fp4_linear(layer: FP4Linear, style: str, rank: int, world: int) -> FP4Linear:
    """The FP4Linear a rank keeps of `layer` split `style` ("column": output rows; "row": input
    columns) over `world` ranks: the same bytes, block scales re-laid in 128x4 per shard, the
    global scales shared. Bias: a column shard keeps its rows; a row shard keeps none (the
    parallel module adds the whole bias once, after the reduction)."""
    op = "shard_fp4_linear"
    if not isinstance(layer, FP4Linear):
        C.fail(op, "layer", "an FP4Linear", type(layer).__name__, TypeError)
    if style not in ("column", "row"):
        C.fail(op, "style", "'column' or 'row'", repr(style))
    n, k, blk = layer.out_features, layer.in_features, layer.fmt.block_size
    data = F.from_weight_layout(layer.weight, layer.weight_layout)
    scale = _rows(layer.weight_scale, n, k // blk)
    if style == "column":
        part = _split(op, "out_features", n, world, 1, "output rows")
        rows = slice(rank * part, (rank + 1) * part)
        data, scale, shape = data[rows], scale[rows], (k, part)
    else:
        part = _split(op, "in_features", k, world, blk, f"a K shard must hold whole {layer.fmt.name.upper()} blocks")
        data = data[:, rank * part // 2:(rank + 1) * part // 2]
        scale = scale[:, rank * part // blk:(rank + 1) * part // blk]
        shape = (part, n)
    bias = layer.bias is not None and style == "column"
    shard = FP4Linear(shape[0], shape[1], bias, layer.fmt, layer.activations, layer.compute_dtype,
                      layer.weight.device, layer.weight_layout_choice)
    nv = layer.fmt is F.NVFP4
    static = layer.activations == "fp4" and layer.static_input_scale
    shard.set_quantized(data.contiguous(), F.swizzle(scale.contiguous(), _LAYOUT),
                        layer.weight_global_scale.clone() if nv else None,
                        layer.input_global_scale.clone() if static else None)
    if bias:
        shard.bias.data.copy_(layer.bias.detach()[rows])
    return shard


class TensorParallelFP4Linear(torch.nn.Module):
    """This rank's shard of an FP4Linear and the collective that completes it (module docstring)."""

    def __init__(self, layer: FP4Linear, style: str, group=None, gather_output: bool = False,
                 input_is_parallel: bool = True):
        super().__init__()
        op = "TensorParallelFP4Linear"
        self.rank, self.world = _group_info(op, group)
        if style == "row" and layer.activations == "fp4" and layer.fmt is F.NVFP4 and not layer.static_input_scale:
            C.fail(op, "layer", "a W4A4 layer with a fixed activation scale for row parallelism (calibrate "
                   "it first)", "a W4A4 layer whose activation scale is computed per call")
        self.group = group if group is not None else dist.group.WORLD
        self.style, self.gather_output, self.input_is_parallel = style, gather_output, input_is_parallel
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.shard = shard_fp4_linear(layer, style, self.rank, self.world)
        self.bias = (torch.nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
                     if style == "row" and layer.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "column":
            y = self.shard(x)
            if not self.gather_output:
                return y
            parts = funcol.wait_tensor(_all_gather(y.movedim(-1, 0).contiguous(), 0, self.group))
            return parts.movedim(0, -1)
        part = self.shard.in_features
        out_dtype = _input("TensorParallelFP4Linear", x, part if self.input_is_parallel else self.in_features,
                           "this rank's in_features slice" if self.input_is_parallel else "in_features")
        if not self.input_is_parallel:
            x = x[..., self.rank * part:(self.rank + 1) * part]
        # fp32 partial products (an fp32 input makes the shard's GEMM write fp32), summed over the
        # ranks, plus the bias in fp32 as FP4Linear adds it (mm_fp4's bias), then rounded once
        y = _all_reduce(self.shard(x.float()), self.group)
        if self.bias is not None:
            y = y + self.bias.float()
        return _widen(y.to(out_dtype), x.dtype)


class _CollectiveExperts:
    """Mixed into a copy of an FP4MoE (or a transformers block's FP4SparseMoeBlock) that holds
    this rank's part: its experts run fused_moe over the part in fp32 and all-reduce, so the
    module's own forward (routing, return structure, shared experts) runs unchanged."""
    group = None
    expert_range: dict = {}

    def _local(self, a, ids, weights) -> torch.Tensor:
        """fused_moe of tokens a over this rank's part, fp32 [T, H]: its share of the sums."""
        return ops.fused_moe(a, *self._expert_args(), ids, weights, out_dtype=torch.float32, **self.expert_range,
                             **self._expert_kwargs())

    def _experts(self, x, a, ids, weights, out_dtype):
        y = _all_reduce(self._local(a, ids, weights), self.group).to(out_dtype)
        return _widen(y.reshape(*x.shape[:-1], self.hidden_size), x.dtype)


_PART_CLASSES: dict = {}


def _part(moe: FP4MoE, buffers: dict, group, **settings) -> FP4MoE:
    """A module of moe's class (plus _CollectiveExperts) with moe's settings, router and
    submodules (a block's shared experts), `buffers` in place of moe's, and `settings` set."""
    cls = type(moe)
    sub = _PART_CLASSES.get(cls)
    if sub is None:
        sub = _PART_CLASSES[cls] = type("Parallel" + cls.__name__, (_CollectiveExperts, cls),
                                        {"__module__": __name__})
    part = sub.__new__(sub)
    torch.nn.Module.__init__(part)
    part.__dict__.update({k: v for k, v in moe.__dict__.items() if not k.startswith("_")})   # its settings
    for name, mod in moe._modules.items():
        part.add_module(name, mod)
    for name, buf in buffers.items():
        part.register_buffer(name, buf)
    part.__dict__.update(settings)
    part.group = group
    keep_state_row_major(part, ("w1", "w2"))   # as FP4MoE.__init__ does
    return part


class _ParallelMoE(torch.nn.Module):
    """What both parallel MoEs share: the checks and the group; forward is the part's own
    (FP4MoE.forward, or the transformers block's: same arguments and return structure)."""

    def _begin(self, op: str, moe: FP4MoE, group) -> None:
        if not isinstance(moe, FP4MoE):
            C.fail(op, "moe", "an FP4MoE (or a transformers block's FP4SparseMoeBlock)", type(moe).__name__,
                   TypeError)
        self.rank, self.world = _group_info(op, group)
        self.group = group if group is not None else dist.group.WORLD
        self.num_experts, self.hidden_size = moe.num_experts, moe.hidden_size

    def forward(self, *args, **kwargs):
        return self.moe(*args, **kwargs)


class ExpertParallelFP4MoE(_ParallelMoE):
    """This rank's experts of an FP4MoE or FP4SparseMoeBlock (module docstring).

    tokens="replicated" (default): every rank passes the same tokens; forward takes and returns
    what the module's forward does, on every rank. tokens="sharded" (an FP4MoE only): each rank
    passes its own tokens x [..., H], the same count on every rank (data-parallel attention);
    forward gathers them, routes and runs its experts over all of them, and a reduce-scatter hands
    each rank the sum for its own tokens."""

    def __init__(self, moe: FP4MoE, group=None, tokens: str = "replicated"):
        super().__init__()
        op = "ExpertParallelFP4MoE"
        self._begin(op, moe, group)
        if tokens not in ("replicated", "sharded"):
            C.fail(op, "tokens", "'replicated' or 'sharded'", repr(tokens))
        if tokens == "sharded" and type(moe) is not FP4MoE:
            C.fail(op, "tokens", "'replicated' for a transformers block (its forward returns per-token "
                   "extras for the tokens it is given)", repr(tokens))
        self.tokens = tokens
        per = _split(op, "num_experts", moe.num_experts, self.world, 1, "experts per rank")
        lo, hi = self.rank * per, (self.rank + 1) * per
        self.offset, self.local_experts = lo, per
        buffers = {}
        for name, buf in moe._buffers.items():
            keep = name.startswith(("w1", "w2")) or (name == "a2_global_scale_bits" and buf.numel() > 1)
            buffers[name] = buf[lo:hi].clone() if keep else buf.clone()
        # num_experts stays the whole count: routing (DeepSeek-V3's groups) works on all experts
        self.moe = _part(moe, buffers, self.group, expert_range=dict(local_expert_offset=lo, num_local_experts=per))

    def forward(self, *args, **kwargs):
        if self.tokens == "replicated":
            return self.moe(*args, **kwargs)
        x, = args
        moe = self.moe
        a, out_dtype = moe._tokens(x, "forward")
        every = funcol.wait_tensor(_all_gather(a, 0, self.group))          # [world T, H], rank order
        y = moe._local(every, *moe._route(every))
        y = funcol.wait_tensor(funcol.reduce_scatter_tensor(y, "sum", 0, self.group)).to(out_dtype)
        return _widen(y.reshape(*x.shape[:-1], self.hidden_size), x.dtype)


class TensorParallelFP4MoE(_ParallelMoE):
    """Every expert's intermediate columns split over the group (module docstring); forward takes
    and returns what the module's forward does, on every rank."""

    def __init__(self, moe: FP4MoE, group=None):
        super().__init__()
        op = "TensorParallelFP4MoE"
        if isinstance(moe, FP4MoE) and (moe.fmt != "nvfp4" or "w1_bias" in moe._buffers or moe.activation != "swiglu"):
            C.fail(op, "moe", "NVFP4 experts without biases and with the plain SwiGLU (tensor parallelism "
                   "of MXFP4 or biased gpt-oss experts is not supported yet; ExpertParallelFP4MoE is)",
                   moe.extra_repr())
        self._begin(op, moe, group)
        e, h, i = moe.num_experts, moe.hidden_size, moe.intermediate_size
        part = _split(op, "intermediate_size", i, self.world, F.NVFP4.block_size,
                      "an FC2 K shard must hold whole NVFP4 blocks")
        lo, hi = self.rank * part, (self.rank + 1) * part
        s1 = torch.stack([_rows(moe.w1_scale[x], 2 * i, h // 16) for x in range(e)])
        s2 = torch.stack([_rows(moe.w2_scale[x], h, i // 16) for x in range(e)])
        w1, w2 = moe.row_major_experts()     # slices of rows and K: row-major bytes, kept so
        buffers = {name: buf.clone() for name, buf in moe._buffers.items()}
        buffers.update(
            w1=torch.cat([w1[:, lo:hi], w1[:, i + lo:i + hi]], dim=1).contiguous(),
            w1_scale=F.swizzle(torch.cat([s1[:, lo:hi], s1[:, i + lo:i + hi]], dim=1).contiguous(), _LAYOUT),
            w2=w2[:, :, lo // 2:hi // 2].contiguous(),
            w2_scale=F.swizzle(s2[:, :, lo // 16:hi // 16].contiguous(), _LAYOUT))
        self.moe = _part(moe, buffers, self.group, intermediate_size=part, weight_layout="row")
