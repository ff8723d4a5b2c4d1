"""Data: the built-in MNIST and CIFAR-10 subsets (found on disk, downloaded, or the bundled sample) with their
provenance, the readers of their file formats, and the front-end for a data set given as a PATH."""
