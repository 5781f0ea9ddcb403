"""AuraKernel: OR-guided tiling, verified tree search over real kernels, and a skill library."""
