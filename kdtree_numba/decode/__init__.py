"""Decoding loops: autoregressive (the baseline) and DDTree; ``generate`` picks one."""
