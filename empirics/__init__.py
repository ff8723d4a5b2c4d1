"""Torch side of the suite: real data, the paper's two networks, training, empirical NTK,
NTK distance, influence, attacks, malleability and loss landscapes."""
