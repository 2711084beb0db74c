"""The DeepSeek-V3 / Kimi-K2 target, its latent KV cache, checkpoints, drafters and tiny presets."""
