"""Budget sweeps (decode/sweep.py): the runs per budget and the chain, and rows pooled over prompts."""
import pytest

import kdtree_numba as kd
import kdtree_numba.viz as viz
from kdtree_numba.decode.sweep import rows_from_runs, sweep_rows
from tests.viz.test_plots import _gen


def test_sweep_rows_numpy():
    with kd.backend.use("numpy"):
        t = kd.tiny_target(0)
        rows = sweep_rows(t, lambda: kd.OracleDrafter(t, noise=0.5, depth=4), list(b"Hi"), [2, 8], 10)
        seen = []
        pooled = sweep_rows(t, lambda: kd.OracleDrafter(t, noise=0.5, depth=4), [list(b"Hi"), list(b"Yo!")],
                                [2, 8], 10, progress=lambda d, n: seen.append((d, n)))
    assert [r["budget"] for r in rows] == [2, 8]
    for r in rows:
        assert set(r) == {"budget", "tree_tau", "tree_fpt", "chain_tau", "chain_fpt", "prompts"}
        assert r["prompts"] == 1
        assert 1.0 <= r["tree_tau"] <= 5 and 0 < r["tree_fpt"] <= 1.1
        assert r["chain_tau"] == rows[0]["chain_tau"] and r["chain_fpt"] == rows[0]["chain_fpt"]
    assert [r["prompts"] for r in pooled] == [2, 2]
    assert seen[-1] == (6, 6) and len(seen) == 6                          # 2 prompts x (chain + 2 budgets)
    viz.budget_sweep(rows)


def test_rows_from_runs_pools_prompts():
    a, b = _gen([1, 3]), _gen([2, 2, 2, 2])                      # 2 + 4 rounds, 1 + 4 and 1 + 8 tokens
    c = _gen([1, 1, 1, 1], settings={"method": "chain", "depth": 4})
    rows = rows_from_runs({16: [a, b], 4: [b]}, [c, c])
    assert [r["budget"] for r in rows] == [4, 16]
    r16 = rows[1]
    assert r16["tree_tau"] == pytest.approx((1 + 3 + 2 * 4) / 6)         # tokens committed / rounds, pooled
    assert r16["tree_fpt"] == pytest.approx((3 + 5) / 14)                 # forwards / tokens, pooled
    assert r16["chain_tau"] == pytest.approx(1.0) and r16["prompts"] == 2 and rows[0]["prompts"] == 1
