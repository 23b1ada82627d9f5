"""The compiled (Numba) inner loops of the convolution algorithms, one module per algorithm."""
