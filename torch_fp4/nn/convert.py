"""quantize_model: nn.Linear layers (and supported transformers MoE blocks) of a model into FP4
modules, in place, with optional calibration of W4A4 activation scales."""
from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass
from typing import Callable, Union

import torch

from .. import formats as F
from .. import hf, ops
from ..ops import _checks as C
from ._common import _activations, _format, _input
from .linear import FP4Linear, _layout_choice
from .moe import FP4MoE, _convert_moe_block


Filter = Union[None, str, Callable[[str, torch.nn.Module], bool]]


@dataclass(frozen=True)
class QuantConfig:
    """What quantize_model does.

    fmt: "nvfp4" or "mxfp4"; activations: "bf16" (W4A16) or "fp4" (W4A4);
    include: None (every nn.Linear), a glob on the module's qualified name ("*.mlp.*"), or a
    predicate (name, module) -> bool; exclude: the same form, applied after include.
    weight_layout: "auto" (each layer in its device's preferred layout, following the module
    across devices), "row", or "sm90" for every converted layer the layout can hold
    (out_features % 128 == 0, in_features % 64 == 0; the others stay "row"): see FP4Linear.
    keep_dense: globs on a layer's qualified name or on its last name component; a layer they
    match stays dense unless `include` (not None) selects it. The default keeps a causal LM's
    `lm_head` dense (its quantization error lands directly on the logits, and it is often
    tied to the input embedding); `keep_dense=()` drops the default.
    Each field is checked on construction (ValueError / TypeError naming it).
    """
    fmt: str = "nvfp4"
    activations: str = "bf16"
    include: Filter = None
    exclude: Filter = None
    weight_layout: str = "auto"
    keep_dense: tuple = ("lm_head",)

    def __post_init__(self):
        _format("QuantConfig", self.fmt)
        _activations("QuantConfig", self.activations)
        for name in ("include", "exclude"):
            flt = getattr(self, name)
            if not (flt is None or isinstance(flt, str) or callable(flt)):
                C.fail("QuantConfig", name, "None, a glob string or a predicate (name, module) -> bool",
                       type(flt).__name__, TypeError)
        _layout_choice("QuantConfig", self.weight_layout)
        if not (isinstance(self.keep_dense, tuple) and all(isinstance(p, str) for p in self.keep_dense)):
            C.fail("QuantConfig", "keep_dense", "a tuple of glob strings",
                   repr(self.keep_dense), TypeError)


def _matches(flt: Filter, name: str, module: torch.nn.Module, default: bool) -> bool:
    if flt is None:
        return default
    if isinstance(flt, str):
        return fnmatch.fnmatchcase(name, flt)
    return bool(flt(name, module))


def _selected(config: QuantConfig, name: str, module: torch.nn.Module) -> bool:
    """Whether config converts the module named `name` (see QuantConfig)."""
    if _matches(config.exclude, name, module, False):
        return False
    last = name.rpartition(".")[2]
    if any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(last, p) for p in config.keep_dense):
        return config.include is not None and _matches(config.include, name, module, False)
    return _matches(config.include, name, module, True)


def _moe_plan(model: torch.nn.Module, config: QuantConfig, fmt, calibration) -> tuple:
    """(supported MoE blocks to convert as (name, block, spec), prefixes of every subtree whose
    nn.Linear layers are not converted one by one), checked in full before anything changes."""
    blocks, dense, seen = [], [], ()
    for name, mod in model.named_modules():
        if seen and name.startswith(seen):
            continue
        if not (isinstance(mod, FP4MoE) or hf.is_moe_like(mod)):
            continue
        if not name and not isinstance(mod, FP4MoE):   # it cannot replace itself in place
            C.fail("quantize_model", "model", "a module holding MoE blocks", type(mod).__name__,
                   TypeError)
        prefix = name + "." if name else ""
        dense.append(prefix)
        seen = tuple(dense)
        if isinstance(mod, FP4MoE) or not _selected(config, name, mod):
            continue      # FP4MoE keeps its router dense; an unselected block stays dense whole
        spec = hf.moe_block_spec(mod)
        cls = type(mod).__name__
        if fmt is not F.NVFP4:
            C.fail("quantize_model", "config.fmt", f"'nvfp4' for MoE block {name} ({cls}): FP4MoE "
                   "experts are NVFP4 (exclude the block to keep it dense)", repr(fmt.name))
        if config.activations == "fp4" and calibration is None:
            C.fail("quantize_model", "calibration", f"sample inputs for W4A4 MoE block {name} "
                   f"({cls}): FP4MoE needs fixed activation global scales (or build it with "
                   "FP4MoE.from_experts(..., calibration=...))", None)
        blocks.append((name, mod, spec))
    return blocks, tuple(dense)


def quantize_model(model: torch.nn.Module, config: QuantConfig = QuantConfig(),
                   calibration=None) -> torch.nn.Module:
    """Replace the nn.Linear modules of `model` selected by `config` with FP4Linear, in place.
    Modules inside an FP4MoE (its dense router) are left alone. A layer `keep_dense` names
    (default: `lm_head`) stays dense unless `include` selects it.

    Mixture-of-experts blocks of Hugging Face transformers models (torch_fp4.hf.MOE_BLOCKS:
    Mixtral's MixtralSparseMoeBlock, Qwen3-MoE's Qwen3MoeSparseMoeBlock, DeepSeek-V3's
    DeepseekV3MoE) selected by `config` become FP4SparseMoeBlock: NVFP4 experts, the router
    kept dense, the block's own routing and return value (see there); W4A4 ones need
    `calibration` and are calibrated on the inputs they see in that run. DeepSeek-V3's shared
    experts stay a dense-structured MLP whose nn.Linear layers are converted to FP4Linear like
    any other selected layer (exclude "*.shared_experts.*" to keep them dense). A module whose
    class name looks like an MoE block (ending in "MoeBlock", "MoE" or "Moe",
    torch_fp4.hf.MOE_LIKE) but is not supported is a ValueError naming its class, unless the
    config leaves it unselected (exclude=...): such a block, like an unselected supported one,
    stays dense whole (its router and experts too). An MoE block with fmt="mxfp4", or with
    activations="fp4" and no calibration, is a ValueError; every check runs before the model is
    changed.

    Layers whose in_features is not a multiple of the block size stay dense, and a warning
    names each of them. Returns the model. A model that is not an nn.Module, a bare nn.Linear
    (which cannot replace itself: use FP4Linear.from_linear), or a config that is not a
    QuantConfig, is a TypeError.

    W4A4 NVFP4 (fmt="nvfp4", activations="fp4") without `calibration` computes each layer's
    activation global scale on every call over the whole batch, so a token's output depends on
    the other tokens (and padding) in the batch. `calibration`, sample inputs to the model (a
    tensor, a tuple of positional arguments or a dict of keyword arguments, passed to
    `model(...)` once under torch.no_grad(), in the model's current train/eval mode), fixes each
    converted layer's input scale to `compute_global_scale` of all the inputs that layer saw in
    that run; outputs are then batch-invariant (see FP4Linear). A converted layer the run never
    reaches keeps the per-call scale, and a warning names it. `calibration` with any other
    config is a ValueError (W4A16 and MXFP4 have no activation global scale to fix).
    """
    if not isinstance(model, torch.nn.Module):
        C.fail("quantize_model", "model", "an nn.Module", type(model).__name__, TypeError)
    if isinstance(model, torch.nn.Linear):     # it cannot replace itself in place
        C.fail("quantize_model", "model", "a module holding nn.Linear layers (for one nn.Linear use "
               "FP4Linear.from_linear(linear, fmt, activations))", "an nn.Linear", TypeError)
    if not isinstance(config, QuantConfig):
        C.fail("quantize_model", "config", "a QuantConfig", type(config).__name__, TypeError)
    fmt = _format("QuantConfig", config.fmt)
    layout = _layout_choice("QuantConfig", config.weight_layout)
    if calibration is not None:
        if not isinstance(calibration, (torch.Tensor, tuple, dict)):
            C.fail("quantize_model", "calibration", "None, a tensor, a tuple of positional "
                   "arguments or a dict of keyword arguments", type(calibration).__name__, TypeError)
        if fmt is not F.NVFP4 or config.activations != "fp4":
            C.fail("quantize_model", "calibration", "None unless fmt='nvfp4' and activations='fp4' "
                   "(only W4A4 NVFP4 has an activation global scale)",
                   f"sample inputs with fmt={fmt.name!r}, activations={config.activations!r}")
    skipped = []
    blocks, moe = _moe_plan(model, config, fmt, calibration)
    # A converted block's shared experts (DeepSeek-V3) are dense projections outside the routed
    # experts: they are converted like any other nn.Linear the config selects.
    shared = tuple(f"{name}.shared_experts." for name, _, spec in blocks
                   if spec.shared_experts is not None)
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, torch.nn.Linear) and not isinstance(mod, FP4Linear)
               and not (moe and name.startswith(moe) and not (shared and name.startswith(shared)))
               and _selected(config, name, mod)]
    moes = []
    for name, block, spec in blocks:
        parent_name, _, child = name.rpartition(".")
        mod = _convert_moe_block(block, spec)
        setattr(model.get_submodule(parent_name) if parent_name else model, child, mod)
        moes.append((name, mod))
    converted = []
    for name, linear in targets:
        if linear.in_features % fmt.block_size:
            skipped.append(f"{name} (in_features={linear.in_features})")
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        fits = F.sm90_layout_reason(linear.out_features, linear.in_features) is None
        wl = layout if fits or layout == "auto" else "row"
        mod = FP4Linear.from_linear(linear, fmt, config.activations, wl)
        setattr(parent, child, mod)
        converted.append((name, mod))
    if skipped:
        warnings.warn(f"quantize_model: kept {len(skipped)} layer(s) dense because in_features is "
                      f"not a multiple of {fmt.block_size}: " + ", ".join(skipped), stacklevel=2)
    if calibration is not None and (converted or moes):
        _calibrate_linears(model, converted, calibration, moes)
    return model


@torch.no_grad()
def _calibrate_linears(model: torch.nn.Module, layers: list, calibration, moes: list = ()) -> None:
    """Fix each W4A4 layer's input scale from the inputs it sees in one run of the model, and
    calibrate each converted MoE block (FP4MoE.calibrate) on all the inputs it saw, then switch
    it to W4A4.

    The run keeps the FP4 weights but leaves activations unquantized (W4A16), as FP4MoE.calibrate
    measures its intermediate activation through W4A16 experts: each layer sees the inputs the
    quantized model gives it, without the per-call W4A4 scales whose batch dependence
    calibration exists to remove.
    """
    amax: dict = {}
    seen: dict = {}

    def collect(mod, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states", kwargs.get("x"))
        seen.setdefault(mod, []).append(x.detach().reshape(-1, mod.hidden_size))

    def record(mod, args, kwargs):
        x = args[0] if args else kwargs.get("x")
        _input("FP4Linear", x, mod.in_features, "in_features")
        # The running maximum of the finite magnitudes is kept in compute_dtype, the dtype forward
        # quantizes in, so compute_global_scale of it is bit-identical to that of all the inputs
        # concatenated (which ignores Inf and NaN).
        a = x.detach().reshape(-1, mod.in_features).to(mod.compute_dtype)
        if a.shape[0] == 0:
            return
        a = a.abs()
        m = torch.where(torch.isfinite(a), a, torch.zeros_like(a)).amax().reshape(1)
        amax[mod] = m if mod not in amax else torch.maximum(amax[mod], m)

    hooks = []
    try:
        for _, mod in layers:
            mod.activations = "bf16"
            hooks.append(mod.register_forward_pre_hook(record, with_kwargs=True))
        for _, mod in moes:
            hooks.append(mod.register_forward_pre_hook(collect, with_kwargs=True))
        if isinstance(calibration, dict):
            model(**calibration)
        elif isinstance(calibration, tuple):
            model(*calibration)
        else:
            model(calibration)
    finally:
        for h in hooks:
            h.remove()
        for _, mod in layers:
            mod.activations = "fp4"
    _finish(layers, amax, lambda mod, m: mod._set_input_scale(ops.compute_global_scale(m.contiguous())),
            "layer(s) saw no input and keep the per-call (batch-dependent) activation global scale")
    _finish(moes, seen, _calibrate_moe,
            "MoE block(s) saw no input and stay W4A16 (FP4MoE's W4A4 needs fixed activation scales)")


def _calibrate_moe(mod: FP4MoE, inputs: list) -> None:
    mod.calibrate(torch.cat(inputs))
    mod.activations = "fp4"


def _finish(items: list, seen: dict, apply: Callable, unseen: str) -> None:
    """apply(module, what the calibration run recorded) for each module it reached; a warning
    names the others."""
    missed = [name for name, mod in items if mod not in seen]
    for _, mod in items:
        if mod in seen:
            apply(mod, seen[mod])
    if missed:
        warnings.warn(f"quantize_model: calibration: {len(missed)} {unseen}: " + ", ".join(missed),
                      stacklevel=4)
