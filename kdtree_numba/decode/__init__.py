"""Decoding loops: autoregressive (the baseline), its graph-replayed form (replay.py) and DDTree; ``generate`` picks
one; ``sweep`` runs budget sweeps."""
