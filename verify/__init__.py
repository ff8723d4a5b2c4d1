"""The `verify` command: orchestration, presets, the claims registry and the audit pipeline."""
