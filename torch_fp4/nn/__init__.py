"""Drop-in modules (layer 4): FP4Linear, FP4MoE and quantize_model.

Weights, block scales and global scales are stored as integer buffers (the FP4 bytes and e4m3 /
e8m0 scale bytes as uint8, fp32 global scales as their int32 bit patterns). `model.to(dtype)`,
`.half()` and `.bfloat16()` therefore never round them, `.to(device)` moves them as plain bytes,
and state_dict holds them exactly. Every op accepts these uint8 views directly.
"""
from .convert import QuantConfig, quantize_model
from .linear import FP4Linear
from .moe import FP4MoE, FP4SparseMoeBlock
from .pretrained import from_pretrained, save_pretrained

__all__ = ["FP4Linear", "FP4MoE", "FP4SparseMoeBlock", "QuantConfig", "quantize_model", "from_pretrained",
           "save_pretrained"]
