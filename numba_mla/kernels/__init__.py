"""Numba CUDA kernels: simt.py (FMA split-K partition kernel), combine.py (LSE merge)."""
