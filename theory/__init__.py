"""Pure mathematics of the paper (arXiv:2603.13085): no torch, no training.

Gram matrices, linearized attention, condition numbers, analytic kernels, kernel ridge
regression with its closed-form leave-one-out, and the width bounds of Thm 4.7.
"""
