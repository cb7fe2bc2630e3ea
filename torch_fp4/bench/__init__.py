"""Benchmarks behind `python -m torch_fp4 bench ...` (GPU only). Every table includes a peer
measured in the same run, and ratios to it."""
