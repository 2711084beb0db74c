"""kdtree_numba: DDTree speculative decoding on a DeepSeek-V3 / Kimi-K2 (MLA + MoE) target, every stage a
numba.cuda kernel module, runnable on a GPU, on numba's CUDA simulator and on plain NumPy references."""
from . import backend
from .config import ConfigError, TargetConfig
from .decode.generate import generate
from .decode.trace import Generation, RoundTrace, TraceError
from .kernels.tree import Tree
from .kernels.tree_build import build_tree, build_trees
from .model.checkpoint import CheckpointError, SkippedWeightsWarning
from .model.dflash import DFlashConfig, DFlashDrafter, load_drafter
from .model.drafters import Drafter, OracleDrafter, RandomDrafter
from .model.presets import tiny_config, tiny_target
from .model.target import Target

__version__ = "0.1.0"


def load_target(path) -> Target:
    """Load an HF DeepSeek-V3-family checkpoint directory (config.json + safetensors; FP8 / INT4 dequantized;
    its tokenizer.json, if any, becomes ``target.tokenizer``)."""
    from .model import checkpoint, tokenizer

    cfg, state = checkpoint.load_state_dict(str(path))
    tok = tokenizer.load(str(path), cfg.vocab_size)
    target = Target.from_state_dict(cfg, state)
    target.tokenizer = tok
    return target


def load_default():
    """The shipped trained pair ``(target, drafter)`` (the package's embedded default model; see its model card:
    ``kdtree_numba/default_model/MODEL_CARD.md``)."""
    from .model.presets import load_default as _load

    return _load()


def __getattr__(name):
    if name == "viz":                  # matplotlib loads only when plots are asked for
        import importlib

        return importlib.import_module(".viz", __name__)
    raise AttributeError(f"module 'kdtree_numba' has no attribute {name!r}")


__all__ = ["backend", "TargetConfig", "ConfigError", "CheckpointError", "Target", "load_target", "load_default",
           "tiny_target",
           "tiny_config", "Drafter", "OracleDrafter", "RandomDrafter", "DFlashDrafter", "DFlashConfig", "load_drafter",
           "generate", "Generation", "RoundTrace",
           "Tree", "build_tree", "build_trees", "__version__"]
