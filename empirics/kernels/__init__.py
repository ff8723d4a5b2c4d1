"""Kernels: the empirical NTK (one entry point), the audit's exact and structured Jacobian families for any model,
and the Monte Carlo infinite-width reference."""
