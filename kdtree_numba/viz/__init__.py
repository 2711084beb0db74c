"""Pictures of DDTree decoding, made from the traces ``kd.generate`` returns.

* ``plot_tree`` / ``plot_rounds`` (trees.py): one round's draft tree, the accepted path and the bonus token;
  ``showcase_rounds`` picks a typical round and the best one to draw.
* ``acceptance_histogram``, ``tree_shape``, ``budget_sweep``, ``stage_times`` (rounds.py): statistics over
  rounds and runs (the budget sweep's rows come from ``kdtree_numba.decode.sweep``: viz never decodes).
* ``training_curves`` (training.py): the default pair's training logs (loss and per-position accuracy).
* ``write_html`` (html.py): a self-contained page that steps through the rounds interactively.
* ``token_label`` / ``text_of`` (labels.py): readable tokens and text (decoded with a tokenizer, byte-level or
  ids). Every function that labels tokens takes ``tokenizer=`` (``target.tokenizer``; None: bytes or ids).

Every plotting function returns a ``matplotlib.figure.Figure`` and saves it when given ``path``. Figures are
made without pyplot (no GUI backend is touched, nothing is shown), so the package works headless.
"""
from .html import write_html
from .labels import text_of, token_label
from .rounds import acceptance_histogram, budget_sweep, stage_times, tree_shape
from .training import training_curves
from .trees import plot_rounds, plot_tree, showcase_rounds

__all__ = ["plot_tree", "plot_rounds", "acceptance_histogram", "tree_shape", "budget_sweep", "stage_times",
           "showcase_rounds", "training_curves", "write_html", "token_label", "text_of"]
