"""FP4 transformers models to and from model directories: `save_pretrained` writes a quantized
causal LM as a transformers model directory whose NVFP4 layers use a checkpoint format's naming
(torch_fp4.checkpoint: ModelOpt or compressed-tensors), and `from_pretrained` builds the FP4
model from such a directory, byte for byte, with no dequantize / requantize.

A directory holds config.json (the model's transformers config plus a `quantization_config`) and
model.safetensors, or shards listed by model.safetensors.index.json. In the safetensors files:
- every NVFP4 linear layer `<prefix>` as its format's tensors (checkpoint.py's table), plus
  `<prefix>.bias` when it has one: it becomes an FP4Linear (W4A4 with the stored activation
  scale fixed when the layer has one, else W4A16);
- the experts of a supported MoE block (torch_fp4.hf.MOE_BLOCKS) as one NVFP4 layer per expert
  and projection, `<block>.experts.<e>.<gate|up|down>` with that family's names: the block
  becomes an FP4SparseMoeBlock. FP4MoE keeps one weight global scale per expert for the
  [gate; up] rows, so an expert whose gate and up scales differ is refused (ModelOpt and
  llm-compressor export them equal: the two share their input). W4A4 experts take the smallest
  gate / up activation encode scale over the experts as the input scale a1 (fused_moe has one;
  the largest amax, so no activation saturates that any expert's scale would not), and each
  expert's down-projection scale as a2 [E];
- every other tensor (embeddings, norms, the LM head, routers, correction biases) dense, cast to
  the parameter's dtype in the model.
A key that names nothing in the model and a parameter that no key fills are errors naming them;
nothing is skipped or filled in silently (tied weights are tied as the config says).

save_pretrained writes one model.safetensors. Dense tensors are written as the model holds them;
NVFP4 layers as checkpoint.save_nvfp4 writes them, so save -> from_pretrained -> save gives the
same bytes (ModelOpt's decode scalars are RN(1/encode), which round-trips: checkpoint.py). A
layer the formats cannot hold is refused: MXFP4 layers, and W4A4 layers without a fixed
activation scale (their scale is computed per call: calibrate them first).

transformers is needed (`pip install torch_fp4[hf]`); torch_fp4 imports it only here.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
from typing import Optional

import torch

from .. import checkpoint as CK
from .. import formats as F
from .. import hf
from ..ops import _checks as C
from ..safetensors_file import open_file
from .linear import FP4Linear
from .moe import FP4MoE, FP4SparseMoeBlock, _finish_block, _routing_kwargs

__all__ = ["save_pretrained", "from_pretrained"]

_CONFIG, _WEIGHTS, _INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
_COMPUTE = (torch.bfloat16, torch.float16)


TESTED_TRANSFORMERS = ((4, 57), (5, 0))   # [from, to): the blocks' forwards were matched in it


def _transformers(op: str):
    """transformers, within the tested range: another major version may store or route its MoE
    blocks differently, which would load without an error and compute something else."""
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"torch_fp4.{op} needs transformers: pip install 'torch_fp4[hf]' "
                          "(transformers>=4.57,<5)") from e
    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    low, high = TESTED_TRANSFORMERS
    if not low <= version < high:
        raise ImportError(f"torch_fp4.{op}: transformers {transformers.__version__} is outside the "
                          "tested range >=4.57,<5: pip install 'transformers>=4.57,<5'")
    return transformers


def quantization_config(fmt: str, w4a4: bool) -> dict:
    """The `quantization_config` save_pretrained writes into config.json for `fmt`."""
    if fmt == "modelopt":
        return {"quant_method": "modelopt", "quant_algo": "NVFP4" if w4a4 else "NVFP4_W4A16",
                "group_size": F.NVFP4.block_size, "producer": {"name": "torch_fp4"}}
    group = {"targets": ["Linear"],
             "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                         "group_size": F.NVFP4.block_size, "symmetric": True, "dynamic": False}}
    if w4a4:
        group["input_activations"] = dict(group["weights"], dynamic="local")
    return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": group}, "producer": "torch_fp4"}


# ---------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------
def _block_class(mod: FP4SparseMoeBlock) -> str:
    for cls in type(mod).__mro__:
        if cls.__name__ in hf.EXPERT_LINEARS:
            return cls.__name__
    C.fail("save_pretrained", type(mod).__name__,
           "an FP4SparseMoeBlock made by quantize_model or from_pretrained from one of "
           + ", ".join(hf.EXPERT_LINEARS), "a block of no supported class", TypeError)


def _linear_weight(name: str, mod: FP4Linear) -> CK.NVFP4Weight:
    op = "save_pretrained"
    if mod.fmt is not F.NVFP4:
        C.fail(op, name, "NVFP4 layers (the checkpoint formats hold NVFP4 only)", "an MXFP4 FP4Linear")
    if mod.activations == "fp4" and not mod.static_input_scale:
        C.fail(op, name, "a W4A4 layer with a fixed activation scale (calibrate it, or "
               "quantize_model(..., calibration=...)): the formats store one scale per layer",
               "a W4A4 layer whose activation scale is computed on every call")
    data = F.from_weight_layout(mod.weight, mod.weight_layout).cpu()
    w4a4 = mod.activations == "fp4"
    return CK.NVFP4Weight(data, mod.weight_scale.cpu(), mod.weight_global_scale.cpu().clone(),
                          mod.input_global_scale.cpu().clone() if w4a4 else None)


def _expert_weights(name: str, mod: FP4MoE) -> dict[str, CK.NVFP4Weight]:
    gate, up, down = hf.EXPERT_LINEARS[_block_class(mod)]
    h, i = mod.hidden_size, mod.intermediate_size
    w4a4 = mod.activations == "fp4"
    a1 = mod.a1_global_scale_bits.view(torch.float32).cpu()
    a2 = mod.a2_global_scale_bits.view(torch.float32).cpu()
    out = {}
    w1, w2 = mod.row_major_experts()
    for e in range(mod.num_experts):
        s1 = F.unswizzle(mod.w1_scale[e].cpu(), 2 * i, h // 16, F.SfLayout.LAYOUT_128x4)
        s2 = F.unswizzle(mod.w2_scale[e].cpu(), h, i // 16, F.SfLayout.LAYOUT_128x4)
        g1 = mod.w1_global_scale_bits[e:e + 1].view(torch.float32).cpu()
        g2 = mod.w2_global_scale_bits[e:e + 1].view(torch.float32).cpu()
        rows = {gate: (w1[e, :i], s1[:i], g1, a1), up: (w1[e, i:], s1[i:], g1, a1),
                down: (w2[e], s2, g2, a2[e:e + 1] if a2.numel() > 1 else a2)}
        for proj, (data, scale, gs, a) in rows.items():
            out[f"{name}.experts.{e}.{proj}"] = CK.NVFP4Weight(
                data.cpu().contiguous(), F.swizzle(scale.contiguous().view(torch.float8_e4m3fn),
                                                   F.SfLayout.LAYOUT_128x4),
                gs.clone(), a.clone() if w4a4 else None)
    return out


def _router_tensors(name: str, mod: FP4MoE) -> dict[str, torch.Tensor]:
    out = {f"{name}.gate.weight": mod.router.weight.detach()}
    if mod.router.bias is not None:
        out[f"{name}.gate.bias"] = mod.router.bias.detach()
    if mod.method == "deepseek_v3":
        out[f"{name}.gate.e_score_correction_bias"] = mod.routing_bias_bits.view(torch.float32)
    return out


def save_pretrained(model: torch.nn.Module, path, fmt: str = "compressed-tensors") -> None:
    """Write a quantized transformers causal LM (quantize_model's, or from_pretrained's) to the
    directory `path` (created): config.json with `quantization_config`, and model.safetensors
    with its NVFP4 layers in checkpoint format `fmt` ("compressed-tensors" or "modelopt") and
    every other tensor as the model holds it. See the module docstring."""
    op = "save_pretrained"
    _transformers(op)
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or not hasattr(config, "to_dict"):
        C.fail(op, "model", "a transformers model (a module with a .config)", type(model).__name__, TypeError)
    CK._naming(op, fmt)
    layers: dict[str, CK.NVFP4Weight] = {}
    dense: dict[str, torch.Tensor] = {}
    owned: list[str] = []          # prefixes whose state_dict entries the NVFP4 layers replace
    for name, mod in model.named_modules():
        if isinstance(mod, FP4Linear):
            layers[name] = _linear_weight(name, mod)
            if mod.bias is not None:
                dense[f"{name}.bias"] = mod.bias.detach()
            owned.append(f"{name}.")
        elif isinstance(mod, FP4MoE):
            layers.update(_expert_weights(name, mod))
            dense.update(_router_tensors(name, mod))
            owned.extend([f"{name}.{b}" for b in mod._buffers] + [f"{name}.router."])
    if not layers:
        C.fail(op, "model", "a model with NVFP4 layers (quantize_model first)", "no FP4Linear or FP4MoE")
    seen: dict[tuple, str] = {}
    for key, t in model.state_dict(keep_vars=True).items():
        if any(key == p.rstrip(".") or key.startswith(p) for p in owned):
            continue
        ident = (t.data_ptr(), t.dtype, tuple(t.shape))   # tied weights: written once
        if t.numel() and ident in seen:
            continue
        seen[ident] = key
        dense[key] = t.detach()
    os.makedirs(path, exist_ok=True)
    w4a4 = any(w.input_global_scale is not None for w in layers.values())
    cfg = copy.deepcopy(config)
    cfg.quantization_config = quantization_config(fmt, w4a4)
    floating = [t.dtype for t in model.parameters() if t.is_floating_point()]
    if floating:   # the dense parts' dtype, which from_pretrained builds the model in
        cfg.torch_dtype = max(set(floating), key=floating.count)
    cfg.save_pretrained(str(path))
    CK.save_safetensors(layers, os.path.join(str(path), _WEIGHTS), fmt,
                        extra_tensors={k: v.cpu() for k, v in dense.items()},
                        metadata={"format": "pt"})   # one entry: the file format keeps no order of several


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _parameters_on_meta():
    """Modules built inside get their parameters on the meta device (no memory, no init);
    buffers stay real (rotary tables and other non-persistent buffers are computed in __init__
    and are not in checkpoints)."""
    register = torch.nn.Module.register_parameter

    def on_meta(self, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(self, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _files(op: str, path: str) -> list[str]:
    index = os.path.join(path, _INDEX)
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        if not shards:
            C.fail(op, index, "a weight_map naming the shards", "none")
        return [os.path.join(path, s) for s in shards]
    single = os.path.join(path, _WEIGHTS)
    if not os.path.exists(single):
        C.fail(op, "path", f"a model directory holding {_WEIGHTS} or {_INDEX}",
               f"{path!r} without either", FileNotFoundError)
    return [single]


def _format_of(op: str, qc, files: list) -> str:
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    if method in CK.CHECKPOINT_FORMATS:
        return method
    if method is not None:
        C.fail(op, "quantization_config.quant_method", " or ".join(map(repr, CK.CHECKPOINT_FORMATS)),
               repr(method))
    return CK.detect_format(files[0])


def _set_tensor(op: str, model: torch.nn.Module, key: str, value: torch.Tensor) -> None:
    """Fill parameter or buffer `key` of model with value (cast to its dtype)."""
    owner, _, attr = key.rpartition(".")
    try:
        mod = model.get_submodule(owner)
    except AttributeError:
        mod = None
    target = None if mod is None else (mod._parameters.get(attr) if attr in mod._parameters
                                       else mod._buffers.get(attr))
    if target is None:
        C.fail(op, key, "a parameter or buffer of the model", "a checkpoint key that names none")
    if tuple(target.shape) != tuple(value.shape):
        C.fail(op, key, f"shape {tuple(target.shape)} (the model's)", f"shape {tuple(value.shape)}")
    value = value.to(target.dtype) if value.dtype != target.dtype else value
    if attr in mod._parameters:
        mod._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)
    else:
        mod._buffers[attr] = value


def _moe_blocks(model: torch.nn.Module, layers: set) -> dict[str, torch.nn.Module]:
    """Supported MoE blocks whose experts are all NVFP4 layers of the checkpoint; a block with
    some quantized experts and some not is refused."""
    out = {}
    for name, mod in model.named_modules():
        names = hf.EXPERT_LINEARS.get(type(mod).__name__)
        experts = getattr(mod, "experts", None)
        if names is None or not isinstance(experts, torch.nn.ModuleList):
            continue
        want = {f"{name}.experts.{e}.{p}" for e in range(len(experts)) for p in names}
        have = want & layers
        if have and have != want:
            C.fail("from_pretrained", f"{name}.experts", f"every expert projection {names} quantized, or none",
                   f"{len(have)} of {len(want)} quantized (missing e.g. {sorted(want - have)[0]!r})")
        if have:
            out[name] = mod
    return out


def _quantized_block(name: str, block: torch.nn.Module, weights: dict, activations: Optional[str]):
    op = "from_pretrained"
    spec = hf.moe_block_spec(block)
    gate, up, down = hf.EXPERT_LINEARS[type(block).__name__]
    w1, s1, g1, w2, s2, g2, a1, a2 = ([] for _ in range(8))
    for e in range(len(spec.w1)):
        wg, wu, wd = (weights[f"{name}.experts.{e}.{p}"] for p in (gate, up, down))
        if not torch.equal(wg.global_scale, wu.global_scale):
            C.fail(op, f"{name}.experts.{e}.{up}",
                   f"the weight global scale of {name}.experts.{e}.{gate} "
                   f"({wg.global_scale.item()!r}): FP4MoE keeps one per expert for [gate; up]",
                   repr(wu.global_scale.item()))
        w1.append(torch.cat([wg.data.view(torch.uint8), wu.data.view(torch.uint8)]))
        s1.append(torch.cat([wg.linear_scale(), wu.linear_scale()]))
        w2.append(wd.data.view(torch.uint8))
        s2.append(wd.linear_scale())
        g1.append(wg.global_scale)
        g2.append(wd.global_scale)
        a1 += [w.input_global_scale for w in (wg, wu)]
        a2.append(wd.input_global_scale)
    given = [a is not None for a in a1 + a2]
    if any(given) and not all(given):
        C.fail(op, f"{name}.experts", "activation scales on every expert projection or on none",
               f"{sum(given)} of {len(given)}")
    w4a4 = all(given) and activations != "bf16"
    kw = _routing_kwargs(spec)
    mod = FP4SparseMoeBlock.from_quantized(
        spec.router, torch.stack(w1), torch.stack(s1).view(torch.uint8), torch.cat(g1), torch.stack(w2),
        torch.stack(s2).view(torch.uint8), torch.cat(g2), activations="fp4" if w4a4 else "bf16",
        a1_global_scale=torch.cat(a1).min().reshape(1) if w4a4 else None,
        a2_global_scale=torch.cat(a2) if w4a4 else None, sf_layout="linear", **kw)
    return _finish_block(mod, spec, type(block))


def from_pretrained(path, *, device="cpu", torch_dtype: Optional[torch.dtype] = None,
                    activations: Optional[str] = None, weight_layout: str = "auto") -> torch.nn.Module:
    """A transformers causal LM with FP4 modules from a model directory holding a ModelOpt or
    compressed-tensors NVFP4 checkpoint (or one save_pretrained wrote). See the module docstring.

    torch_dtype: the dtype of the dense parts (default: the config's, else bf16); activations:
    None (W4A4 where the checkpoint stores activation scales, W4A16 elsewhere) or "bf16" (W4A16
    everywhere); weight_layout: FP4Linear's. Returns the model in eval mode on `device`.
    """
    op = "from_pretrained"
    tr = _transformers(op)
    if activations not in (None, "bf16"):
        C.fail(op, "activations", "None (as the checkpoint stores) or 'bf16'", repr(activations))
    path = str(path)
    if not os.path.exists(os.path.join(path, _CONFIG)):
        C.fail(op, "path", f"a model directory holding {_CONFIG}", repr(path), FileNotFoundError)
    config = tr.AutoConfig.from_pretrained(path, local_files_only=True)
    qc = getattr(config, "quantization_config", None)
    if qc is not None:
        del config.quantization_config
    dtype = torch_dtype or getattr(config, "torch_dtype", None) or torch.bfloat16
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    files = _files(op, path)
    with _parameters_on_meta():
        model = tr.AutoModelForCausalLM.from_config(config, dtype=dtype)
    compute = dtype if dtype in _COMPUTE else torch.bfloat16
    buffers = dict(model.named_buffers())
    unfilled = {n for n in model.state_dict() if n in buffers}   # persistent buffers: the checkpoint's

    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(open_file(op, f, "cpu")) for f in files]
        fmt = _format_of(op, qc, opened)
        weights: dict[str, CK.NVFP4Weight] = {}
        consumed: set[str] = set()
        naming = CK._naming(op, fmt)
        for tensors, file in zip(opened, files):
            with CK._file_named_in_errors(file):
                for prefix in CK.find_prefixes(tensors, fmt):
                    CK._require_complete(op, tensors, fmt, prefix)
                    weights[prefix] = CK.load_nvfp4(tensors, prefix, fmt)
                    consumed.update(CK._key(prefix, n) for n in naming.names)
        blocks = _moe_blocks(model, set(weights))
        expert_layers = {p for p in weights if any(p.startswith(f"{b}.experts.") for b in blocks)}
        biases: dict[str, torch.Tensor] = {}
        for tensors, file in zip(opened, files):
            with CK._file_named_in_errors(file):
                for key in tensors.keys():
                    if key in consumed:
                        continue
                    owner = key.rpartition(".")[0]
                    if key.endswith(".bias") and owner in weights:
                        if owner in expert_layers:
                            C.fail(op, key, "no bias on a MoE expert projection (fused_moe has none)", "a bias")
                        biases[owner] = tensors[key]
                        continue
                    _set_tensor(op, model, key, tensors[key])
                    unfilled.discard(key)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    for prefix, w in weights.items():
        if prefix in expert_layers:
            continue
        try:
            linear = model.get_submodule(prefix)
        except AttributeError:
            linear = None
        if not isinstance(linear, torch.nn.Linear):
            C.fail(op, prefix, "an nn.Linear of the model (an NVFP4 layer of the checkpoint)",
                   type(linear).__name__ if linear is not None else "no such module")
        if (linear.in_features, linear.out_features) != (w.in_features, w.out_features):
            C.fail(op, prefix, f"a [{linear.out_features}, {linear.in_features}] weight (the model's)",
                   f"[{w.out_features}, {w.in_features}]")
        if (linear.bias is not None) != (prefix in biases):
            C.fail(op, f"{prefix}.bias", "a bias" if linear.bias is not None else "no bias (the model has none)",
                   "none" if linear.bias is not None else "a bias")
        w4a4 = w.input_global_scale is not None and activations != "bf16"
        model.set_submodule(prefix, FP4Linear.from_checkpoint(
            w, biases.get(prefix), "fp4" if w4a4 else "bf16", compute, weight_layout))
    for name, block in blocks.items():
        model.set_submodule(name, _quantized_block(name, block, weights, activations))
    missing = [n for n, t in model.named_parameters() if t.is_meta]
    missing += sorted(n for n in unfilled if dict(model.named_buffers()).get(n) is buffers[n])
    if missing:
        C.fail(op, "checkpoint", f"a tensor for every parameter of the model in {path!r}",
               f"none for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return model.to(device).eval()
