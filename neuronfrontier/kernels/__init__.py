"NKI kernels: each module is exported from its notebook (nbs/1x_kernel_*.ipynb) and registers with `ops`."
