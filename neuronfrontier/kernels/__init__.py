"NKI kernels. Each module is exported from its notebook (nbs/1x_kernel_*.ipynb) and registers itself with `neuronfrontier.ops`."
