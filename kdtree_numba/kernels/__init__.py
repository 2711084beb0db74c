"""One module per stage: NumPy reference + numba.cuda kernel(s) + a validating launcher."""
