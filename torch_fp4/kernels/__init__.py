"""GPU kernels and their launchers (layer 2). Each backend loads lazily: nothing here is imported
until an op asks for that backend, so torch_fp4 imports on machines without a GPU."""
