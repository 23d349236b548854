"Research tools: step-cost models, scaling fits, sweeps, plans, CORE, diagnostics, kernel tuning."
