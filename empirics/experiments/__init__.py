"""Experiments: the paper's measurements, one module each (NTK distance against width, influence malleability and
its statistics, the loss landscape, retrain-based flips, premises, the kappa sweep)."""
