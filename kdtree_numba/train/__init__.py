"""Training code (torch, tokenizers): the `train` extra. Never imported by the inference path."""
