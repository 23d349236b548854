"A budgeted run: the trainer, its clock, checkpoints, processes, faults, spike guards and flags."
