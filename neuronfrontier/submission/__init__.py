"The submission: bundling train.py, shipping it with nf_kernels/, the kit contract and the rehearsal."
