"""Absorbed MLA attention (causal) and tree-verify attention (ancestor-only) against explicit references, for every
kernel variant (v1: per token and head group; v2 / v3: tiles of query rows on tensor cores, 3xTF32, with key tiles
of 16 / 32 rows). Simulator cases
are tiny (a few blocks); ``gpu`` cases run Kimi-sized shapes on a real GPU."""
import numpy as np
import pytest
from numba import cuda, float32

import kdtree_numba as kd
from kdtree_numba.kernels import mla_attention as mla, tree as kt, tree_verify as tv
from kdtree_numba.kernels._intrinsics import copy_async_wait, view2d

from ..helpers import poisoned

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host
TOL = dict(rtol=1e-4, atol=1e-4)          # 3xTF32 and fp32 both hold 1e-4 of the float64 reference


def random_parents(n: int, rng, span: int = 4) -> np.ndarray:
    """A random tree of n nodes under a root in pop order (every parent before its children)."""
    return np.concatenate([[-1], [rng.integers(max(0, j - span), j) for j in range(1, n + 1)]]).astype(np.int64)


@pytest.mark.parametrize("variant", mla.VARIANTS)
@pytest.mark.parametrize("T,N,D,lkv,start,splits", [(3, 5, 13, 9, 6, None), (1, 2, 20, 16, 11, 3),
                                                    (4, 4, 9, 5, 0, 2), (2, 1, 7, 7, 17, None)])
def test_causal_matches_reference(T, N, D, lkv, start, splits, variant):
    rng = np.random.default_rng(T * 100 + D)
    q = rng.standard_normal((T, N, D)).astype(np.float32)
    cache = rng.standard_normal((start + T + 3, D)).astype(np.float32)
    out = poisoned((T, N, lkv))
    mla.mla_attention(q, cache, start, 0.37, lkv, out=out, splits=splits, variant=variant)
    np.testing.assert_allclose(H(out), mla.mla_attention_ref(q, cache, start, 0.37, lkv), **TOL)


TILED = ("v2", "v3", "v4", "v5", "v6", "v7", "v8")
TILED_CAUSAL = ("v2", "v3", "v4", "v5", "v8")   # v6 / v7: v5's and v4's pieces recombined, covered by the tree cases


@pytest.mark.parametrize("variant", TILED_CAUSAL)
@pytest.mark.parametrize("T,N,D,lkv,start,splits", [
    (3, 20, 24, 16, 9, None),     # 60 query rows: 2 tiles, tile 0 = token 0 + 12 heads of token 1 (masked keys)
    (5, 3, 13, 9, 0, None),       # 15 rows, 5 tokens in one tile: the causal mask inside the tile
    (2, 33, 16, 8, 4, 2),         # 66 rows: 3 tiles, the last with 2 rows; 2 key splits + combine
    (1, 7, 20, 16, 40, 3),        # decode: one token, 3 splits of 16 rows
    (1, 3, 20, 16, 170, 11),      # 11 splits: the combine's eight-split steps, the second one partial
    (2, 2, 140, 136, 5, None),    # Lkv > 128: 4 warps on the simulator (2 k-parts, 2 column groups)
])
def test_tiled_causal(T, N, D, lkv, start, splits, variant):
    rng = np.random.default_rng(T + N + D)
    q = (2 * rng.standard_normal((T, N, D))).astype(np.float32)
    cache = rng.standard_normal((start + T + 2, D)).astype(np.float32)
    out = poisoned((T, N, lkv))
    mla.mla_attention(q, cache, start, 0.3, lkv, out=out, splits=splits, variant=variant)
    want = mla.mla_attention_ref(q, cache, start, 0.3, lkv)
    np.testing.assert_allclose(H(out), want, **TOL)
    if T == 5:                        # rows token 0 must not see (its tile loads them for later tokens): masked
        future = cache.copy()
        future[start + 1:] = 1e6
        got0 = H(mla.mla_attention(q, future, start, 0.3, lkv, splits=splits, variant=variant))[0]
        np.testing.assert_array_equal(got0, H(out)[0])


def test_docstring_example():
    q = np.array([[[0.0, 0.0]], [[np.log(3.0), 0.0]]], np.float32)
    cache = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    for variant in mla.VARIANTS:
        np.testing.assert_allclose(H(mla.mla_attention(q, cache, 0, 1.0, 1, variant=variant))[:, 0, 0], [1.0, 0.75],
                                   rtol=1e-6)


@pytest.mark.parametrize("variant", mla.VARIANTS)
@pytest.mark.parametrize("parents,start,splits", [([-1, 0, 0, 1, 3, 1, 0], 5, None), ([-1], 3, None),
                                                  ([-1, 0, 1, 2, 3], 0, None), ([-1, 0, 0, 2, 2, 4], 9, 2)])
def test_tree_attention_sees_only_committed_rows_and_ancestors(parents, start, splits, variant):
    rng = np.random.default_rng(len(parents) + start)
    n1, N, D, lkv = len(parents), 3, 11, 8
    q = rng.standard_normal((n1, N, D)).astype(np.float32)
    cache = rng.standard_normal((start + n1 + 2, D)).astype(np.float32)
    paths, depths = kt.ancestor_paths(np.array(parents))
    out = poisoned((n1, N, lkv))
    tv.tree_attention(q, cache, start, paths, depths, 0.5, lkv, out=out, splits=splits, variant=variant)
    want = tv.tree_attention_ref(q, cache, start, np.array(parents), 0.5, lkv)
    np.testing.assert_allclose(H(out), want, **TOL)
    # a chain is exactly causal attention
    if parents == [-1, 0, 1, 2, 3]:
        np.testing.assert_allclose(H(out), mla.mla_attention_ref(q, cache, start, 0.5, lkv), **TOL)


@pytest.mark.parametrize("variant", TILED)
@pytest.mark.parametrize("n,N,start,splits,seed", [(9, 4, 6, None, 0),     # 40 rows: tiles of 8 and 2 tokens
                                                  (6, 10, 3, 2, 1),       # tiles straddle tokens; 2 splits
                                                  (5, 1, 0, None, 2)])    # 6 tokens in one tile, no committed rows
def test_tiled_tree_random_trees(n, N, start, splits, seed, variant):
    rng = np.random.default_rng(seed)
    parents = random_parents(n, rng)
    D, lkv = 12, 8
    q = (2 * rng.standard_normal((n + 1, N, D))).astype(np.float32)
    cache = rng.standard_normal((start + n + 3, D)).astype(np.float32)
    paths, depths = kt.ancestor_paths(parents, max_depth=int(kt.ancestor_paths(parents)[1].max()) + 1)
    out = poisoned((n + 1, N, lkv))
    tv.tree_attention(q, cache, start, paths, depths, 0.4, lkv, out=out, splits=splits, variant=variant)
    want = tv.tree_attention_ref(q, cache, start, parents, 0.4, lkv)
    np.testing.assert_allclose(H(out), want, **TOL)
    if seed:
        return
    # the last node ignores every tree row off its path: poisoning them leaves its output bit for bit unchanged
    last = n
    on_path = set(paths[last, :depths[last] + 1].tolist())
    other = cache.copy()
    other[[start + j for j in range(n + 1) if j not in on_path]] = 1e3
    got = H(tv.tree_attention(q, other, start, paths, depths, 0.4, lkv, splits=splits, variant=variant))
    np.testing.assert_array_equal(got[last], H(out)[last])


@pytest.mark.parametrize("variant", ("v3", "v4", "v5", "v7"))   # v6, v8: the same score and P V paths
def test_tiled_tree_at_kimi_row_width_on_eight_warps(variant, rng=np.random.default_rng(1)):
    """D 576, Lkv 512: the simulator launches 8 warps, as the GPU does, so every k-part and column group is in use
    and P V takes its unguarded path (all FRAGS / FRAGS4 fragments) - the one the small cases above never reach.
    Two tree tokens x 16 heads over 20 committed rows: one tile of query rows, one of keys (~15 s a variant)."""
    parents = np.array([-1, 0], np.int64)
    paths, depths = kt.ancestor_paths(parents)
    q = (rng.standard_normal((2, 16, 576)) * 0.5).astype(np.float32)
    cache = rng.standard_normal((40, 576)).astype(np.float32)
    out = tv.tree_attention(q, cache, 20, paths, depths, 0.05, 512, variant=variant, splits=1)
    want = tv.tree_attention_ref(q.astype(np.float64), cache.astype(np.float64), 20, parents, 0.05, 512)
    np.testing.assert_allclose(H(out), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", mla.VARIANTS)
def test_device_side_start_equals_host_int(variant):
    """start as a device int32 [1] (graph replay reads it in the kernel; the grid covers the whole cache)."""
    rng = np.random.default_rng(5)
    T, N, D, lkv, start = 2, 3, 12, 8, 6
    q = rng.standard_normal((T, N, D)).astype(np.float32)
    cache = rng.standard_normal((start + T + 9, D)).astype(np.float32)
    dev = kd.backend.full((1,), start, np.int32)
    got = H(mla.mla_attention(q, cache, dev, 0.3, lkv, variant=variant, splits=2))
    np.testing.assert_allclose(got, mla.mla_attention_ref(q, cache, start, 0.3, lkv), **TOL)
    parents = np.array([-1, 0, 0, 1])
    paths, depths = kt.ancestor_paths(parents)
    qt = rng.standard_normal((4, N, D)).astype(np.float32)
    got = H(tv.tree_attention(qt, cache, dev, paths, depths, 0.3, lkv, variant=variant))
    np.testing.assert_allclose(got, tv.tree_attention_ref(qt, cache, start, parents, 0.3, lkv), **TOL)


@pytest.mark.parametrize("variant", TILED)
@pytest.mark.parametrize("splits", [2, 5])
def test_device_side_start_splits_share_out_the_real_keys(variant, splits):
    """With a device start the tiled kernels cut each block's real key list over the planned splits themselves
    (``mla_attention.split_range``), not the cache's capacity: 3 key tiles over 2 splits, or over 5 with splits
    left empty, in a cache of twice the rows - the same output as the reference."""
    rng = np.random.default_rng(splits)
    T, N, D, lkv, start = 2, 3, 12, 8, 38
    q = rng.standard_normal((T, N, D)).astype(np.float32)
    cache = rng.standard_normal((2 * (start + T + 4), D)).astype(np.float32)
    dev = kd.backend.full((1,), start, np.int32)
    got = H(mla.mla_attention(q, cache, dev, 0.3, lkv, variant=variant, splits=splits))
    np.testing.assert_allclose(got, mla.mla_attention_ref(q, cache, start, 0.3, lkv), **TOL)
    parents = np.array([-1, 0, 0, 1])
    paths, depths = kt.ancestor_paths(parents)
    qt = rng.standard_normal((4, N, D)).astype(np.float32)
    got = H(tv.tree_attention(qt, cache, dev, paths, depths, 0.3, lkv, variant=variant, splits=splits))
    np.testing.assert_allclose(got, tv.tree_attention_ref(qt, cache, start, parents, 0.3, lkv), **TOL)


def test_splits_past_the_key_list_are_never_read(monkeypatch):
    """A split that starts past its block's key list writes l = -1 and nothing else; the combine stops there and
    never reads its o (NaN-filled partial buffers: the same output as the reference)."""
    real = mla._partials

    def poisoned_partials(splits, T, N, lkv):
        direct, o, m, l = real(splits, T, N, lkv)
        for a in (o, m, l):
            a[...] = np.nan
        return direct, o, m, l

    monkeypatch.setattr(mla, "_partials", poisoned_partials)
    rng = np.random.default_rng(9)
    T, N, D, lkv, start = 1, 3, 12, 8, 20
    q = rng.standard_normal((T, N, D)).astype(np.float32)
    cache = rng.standard_normal((4 * (start + T), D)).astype(np.float32)
    dev = kd.backend.full((1,), start, np.int32)
    for variant, splits in (("v2", 3), ("v2", 9), ("v4", 5)):   # v2: 2 tiles of 16 keys, 1 or 7 splits past the
        got = H(mla.mla_attention(q, cache, dev, 0.3, lkv, variant=variant, splits=splits))   # list; v4: 1 of 32, 4
        np.testing.assert_allclose(got, mla.mla_attention_ref(q, cache, start, 0.3, lkv), **TOL)


def test_bad_splits_and_shapes_name_the_argument():
    q, cache = np.zeros((2, 3, 8), np.float32), np.zeros((6, 8), np.float32)
    for splits in (0, -1, 1.5):
        with pytest.raises(ValueError, match="splits"):
            mla.mla_attention(q, cache, 1, 1.0, 4, splits=splits)
        with pytest.raises(ValueError, match="splits"):
            tv.tree_attention(q, cache, 1, np.zeros((2, 1), np.int32), np.zeros(2, np.int32), 1.0, 4, splits=splits)


def test_variant_selection():
    assert mla.default_variant() == ("v5" if kd.backend.name == "cuda" else "v1")
    assert mla.check_variant(None) == mla.default_variant()
    with pytest.raises(ValueError, match="variant: expected one of 'v1', 'v2', 'v3', 'v4', 'v5', 'v6', 'v7', 'v8', 'gemm' or None, got 'v9'"):
        mla.mla_attention(np.zeros((1, 1, 4), np.float32), np.zeros((2, 4), np.float32), 0, 1.0, 3, variant="v9")


def test_tree_variant_takes_v2_below_16_heads_where_the_default_has_32_key_tiles():
    assert tv.tree_variant("v5", 8, True) == "v2"                 # the default pair's verify (measured faster)
    assert tv.tree_variant("v3", 8, True) == "v2"
    assert tv.tree_variant("v5", tv.V3_MIN_HEADS, True) == "v5"   # bench_verify's cells: the default
    assert tv.tree_variant("v5", 8, False) == "v5"                # v2 could not stage its query rows
    assert tv.tree_variant("v1", 8, True) == "v1"                 # the simulator's default stays


def test_ancestor_paths_example():
    paths, depths = kt.ancestor_paths(np.array([-1, 0, 0, 1]))
    np.testing.assert_array_equal(depths, [0, 1, 1, 2])
    np.testing.assert_array_equal(paths, [[0, -1, -1], [0, 1, -1], [0, 2, -1], [0, 1, 3]])


@pytest.mark.parametrize("call, msg", [
    (lambda: mla.mla_attention(np.zeros((2, 2, 4), np.float32), np.zeros((3, 4), np.float32), 2, 1.0, 3),
     "start: 2 \\+ 2 new rows exceed"),
    (lambda: mla.mla_attention(np.zeros((2, 2, 4), np.float32), np.zeros((9, 5), np.float32), 0, 1.0, 3),
     r"cache: expected shape \(\*, 4\)"),
    (lambda: mla.mla_attention(np.zeros((2, 2, 4), np.float32), np.zeros((9, 4), np.float32), 0, 0.0, 3),
     "scale: expected a number > 0"),
    (lambda: mla.mla_attention(np.zeros((2, 2, 4), np.float32), np.zeros((9, 4), np.float32), 0, 1.0, 5),
     "lkv: expected an integer <= 4"),
    (lambda: tv.tree_attention(np.zeros((2, 1, 4), np.float32), np.zeros((9, 4), np.float32), 0,
                               np.zeros((3, 2), np.int32), np.zeros(2, np.int32), 1.0, 3), r"paths: expected shape"),
    (lambda: tv.tree_attention(np.zeros((2, 1, 4), np.float32), np.zeros((9, 4), np.float32), 8,
                               np.zeros((2, 2), np.int32), np.zeros(2, np.int32), 1.0, 3), "start: 8 \\+ 2 tree rows"),
    (lambda: tv.tree_attention(np.zeros((2, 1, 4), np.float32), np.zeros((9, 4), np.float32), 0,
                               np.zeros((2, 2), np.int32), np.zeros(2, np.int32), 1.0, 3, max_depth=2),
     "max_depth: expected an integer <= 1"),
    (lambda: tv.tree_attention(np.zeros((2, 1, 4), np.float32), np.zeros((9, 4), np.float32), 0,
                               np.zeros((2, 2), np.int32), np.zeros(2, np.int32), 1.0, 3, variant="fast"),
     "variant: expected one of"),
])
def test_bad_input(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


@pytest.mark.parametrize("T,N,D,S,lkv", [(3, 5, 13, 11, 9), (66, 4, 40, 130, 32), (1, 2, 7, 1, 7)])
def test_numpy_backend_float32_path_matches_the_float64_reference(T, N, D, S, lkv):
    rng = np.random.default_rng(T + S)
    q = (3 * rng.standard_normal((T, N, D))).astype(np.float32)
    keys = rng.standard_normal((S, D)).astype(np.float32)
    visible = rng.random((T, S)) < 0.7
    visible[:, 0] = True                                   # every row sees something
    np.testing.assert_allclose(mla.masked_attention_fast(q, keys, visible, 0.3, lkv),
                               mla.masked_attention_ref(q, keys, visible, 0.3, lkv), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ GPU, Kimi shapes
@pytest.mark.gpu
@pytest.mark.parametrize("variant", mla.VARIANTS)
@pytest.mark.parametrize("T,N,start", [(1, 64, 4090), (3, 64, 4000), (100, 16, 300), (37, 20, 1000)])
def test_gpu_causal_kimi_shapes(T, N, start, variant):
    rng = np.random.default_rng(T + N)
    q = rng.standard_normal((T, N, 576)).astype(np.float32)
    cache = rng.standard_normal((start + T + 5, 576)).astype(np.float32)
    got = H(mla.mla_attention(q, cache, start, 0.1307, 512, out=poisoned((T, N, 512)), variant=variant))
    np.testing.assert_allclose(got, mla.mla_attention_ref(q, cache, start, 0.1307, 512), **TOL)
    dev = kd.backend.full((1,), start, np.int32)         # device start: grid over the whole cache, splits past it
    np.testing.assert_allclose(H(mla.mla_attention(q, cache, dev, 0.1307, 512, variant=variant)), got, **TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", mla.VARIANTS)
@pytest.mark.parametrize("n,N,start", [(200, 16, 1000), (64, 64, 3000), (16, 16, 20000)])
def test_gpu_tree_kimi_shapes(n, N, start, variant):
    rng = np.random.default_rng(n + N)
    parents = random_parents(n, rng, span=8)
    paths, depths = kt.ancestor_paths(parents)
    q = rng.standard_normal((n + 1, N, 576)).astype(np.float32)
    cache = rng.standard_normal((start + n + 1, 576)).astype(np.float32)
    want = tv.tree_attention_ref(q, cache, start, parents, 0.13, 512)
    got = H(tv.tree_attention(q, cache, start, paths, depths, 0.13, 512, out=poisoned((n + 1, N, 512)),
                              variant=variant))
    np.testing.assert_allclose(got, want, **TOL)
    dev = kd.backend.full((1,), start, np.int32)
    np.testing.assert_allclose(H(tv.tree_attention(q, cache, dev, paths, depths, 0.13, 512, variant=variant)), want,
                               **TOL)


def _compiled_tiled_kernels() -> dict:
    """{kernel: variant} of the causal and tree tiled kernels, each compiled by a launch at Kimi's widths."""
    rng = np.random.default_rng(3)
    parents = random_parents(20, rng)
    paths, depths = kt.ancestor_paths(parents)
    q = rng.standard_normal((21, 16, 576)).astype(np.float32)
    cache = rng.standard_normal((300, 576)).astype(np.float32)
    for variant in TILED:
        tv.tree_attention(q, cache, 200, paths, depths, 0.1, 512, variant=variant)
        mla.mla_attention(q, cache, 200, 0.1, 512, variant=variant)
    return {**{k: v for v, k in mla.TILED_KERNELS.items()}, **{k: v for v, k in tv.TREE_KERNELS.items()}}


ALIGN, ROW_T = mla.TILE_ALIGN, mla.ROW_T     # module constants: numba wants the alignment as a literal


@cuda.jit
def _load_keys_kernel(src, rows, width, col, out):
    """The tiled kernels' key-tile load on its own: rows[j] of src -> tile row j from column ``col`` -> out."""
    dyn = cuda.shared.array(0, float32, alignment=ALIGN)
    kt_rows, D = rows.shape[0], src.shape[1]
    ks = view2d(dyn, 0, kt_rows, ROW_T)
    for i in range(cuda.threadIdx.x, kt_rows * ROW_T, cuda.blockDim.x):
        ks[i // ROW_T, i % ROW_T] = float32(-7.0)                 # poison: every copied float overwrites it
    cuda.syncthreads()
    mla._v2_load_keys(src, rows, ks, D, width, D, 0, col, kt_rows)
    copy_async_wait()
    cuda.syncthreads()
    for i in range(cuda.threadIdx.x, kt_rows * D, cuda.blockDim.x):
        out[i // D, i % D] = ks[i // D, col + i % D]


@pytest.mark.parametrize("kt_rows,D,width,col", [(32, 20, 4, 0), (16, 13, 1, 3), (4, 576, 4, 4), (32, 8, 4, 4)])
def test_key_tile_load_every_row_share(kt_rows, D, width, col, rng=np.random.default_rng(9)):
    """``_v2_load_keys`` (a group of 256 / kt threads per tile row, ``copy_row``'s strided copies): each row lands
    whole, a row of -1 as zeros, whatever the group size (8, 16, 64 threads a row) and the copy width - including
    rows of fewer copies than the group has threads (D 20 / 4 = 5 copies for 8 threads)."""
    src = rng.standard_normal((40, D)).astype(np.float32)
    rows = rng.integers(-1, 40, kt_rows).astype(np.int32)
    rows[0] = -1
    out = poisoned((kt_rows, D))
    kd.backend.launch(_load_keys_kernel, 1, 32 * mla.WARPS, kd.backend.asarray(src), kd.backend.asarray(rows),
                      width, col, out, shared=4 * kt_rows * mla.ROW_T)
    want = np.where(rows[:, None] >= 0, src[np.maximum(rows, 0)], 0)
    np.testing.assert_array_equal(H(out), want)


@pytest.mark.gpu
def test_static_shared_memory_within_the_launchers_budget():
    """The launchers check STATIC_BYTES (copied from ptxas) + the dynamic part against the device's per-block limit:
    every compiled tiled kernel's static shared memory must be within it (a kernel that grew would under-count)."""
    for kernel, variant in _compiled_tiled_kernels().items():
        sizes = kernel.get_shared_mem_per_block()
        assert sizes and max(sizes.values()) <= mla.STATIC_BYTES[variant], (kernel, sizes)


@pytest.mark.gpu
def test_tiled_key_splits_count_one_block_per_sm():
    """tiled_wave counts V2_MIN_BLOCKS (1) block per SM because no second block fits: eight warps x the
    registers ptxas gave each compiled tiled kernel exceed half an SM's 64K registers (a kernel that shrank below
    would want its waves counted again). The default pair's 65-node verify over a 512-row cache (17 row tiles,
    32-key tiles) then runs 6 splits of 96 keys: 102 blocks, not 16 x 17 in three waves."""
    for kernel in _compiled_tiled_kernels():
        regs = max(kernel.get_regs_per_thread().values())
        assert 2 * regs * 32 * mla.WARPS > 65536, (kernel, regs)
    target = mla.tiled_wave()
    assert target == kd.backend.sm_count() * mla.V2_MIN_BLOCKS
    if target == 132:                                                             # an H200 / H100 SXM
        assert mla.plan_splits(17, 512, mla.KT3, mla.KT3, None, target) == (6, 96)


@pytest.mark.parametrize("variant", ("v2", "v3", "v5"))  # v4's 109 KB without the staged rows exceed 99 KB
def test_tiled_without_room_for_staged_query_rows(monkeypatch, variant):
    """A GPU that gives a block less than a tiled kernel's static arrays + key tile + 74 KB of staged query rows
    (sm_86 / sm_89: 99 KB) gets launches with the key tile only and query rows read from global memory: the same
    products in the same order, so the outputs are bit for bit those of the staged launch."""
    rng = np.random.default_rng(7)
    parents = random_parents(4, rng)
    paths, depths = kt.ancestor_paths(parents)
    q = rng.standard_normal((5, 2, 12)).astype(np.float32)                     # 10 query rows: one tile
    cache = rng.standard_normal((56, 12)).astype(np.float32)
    qc = rng.standard_normal((3, 3, 12)).astype(np.float32)
    start = mla.STAGE_MIN_KEYS                                 # both launches below have splits that stage

    def run():                                                 # one split each: a GPU would cut 16-key ones
        return (H(tv.tree_attention(q, cache, start, paths, depths, 0.4, 8, variant=variant, splits=1)),
                H(mla.mla_attention(qc, cache, start, 0.4, 8, variant=variant, splits=1)))
    assert mla.stage_bytes(variant) == mla.Q_BYTES2
    staged = run()
    monkeypatch.setattr(kd.backend, "shared_optin", lambda: 101376)
    assert mla.stage_bytes(variant) == 0 and mla.tiled_fits(variant)
    plain = run()
    np.testing.assert_allclose(plain[0], tv.tree_attention_ref(q, cache, start, parents, 0.4, 8), **TOL)
    np.testing.assert_allclose(plain[1], mla.mla_attention_ref(qc, cache, start, 0.4, 8), **TOL)
    for a, b in zip(plain, staged):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("optin, want", [(232448, "v5"), (166912, "v2"), (101376, "v5"), (65536, "v2")])
def test_default_tiled_variant_by_shared_memory(monkeypatch, optin, want):
    """What variant=None runs on a GPU: v5 where it stages its query rows (H100 / H200), v2 where only v2 can (A100:
    staging pays more than longer tiles), v5 unstaged where neither stages (sm_86 / sm_89), v2 where v5 does not fit
    (sm_75)."""
    monkeypatch.setattr(kd.backend, "shared_optin", lambda: optin)
    assert mla.tiled_default() == want


def test_v3_needs_its_shared_memory(monkeypatch):
    """v3's 74 KB key tile does not fit a 64 KB block (sm_75): named error; v2's 37 KB one does."""
    monkeypatch.setattr(kd.backend, "shared_optin", lambda: 65536)
    q, cache = np.zeros((1, 2, 8), np.float32), np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="variant: v3 needs 93440 bytes of shared memory per block, this GPU gives "
                                         "65536; use 'v2'"):
        mla.mla_attention(q, cache, 1, 1.0, 4, variant="v3")
    with pytest.raises(ValueError, match="variant: v3 needs"):
        tv.tree_attention(q, cache, 1, np.zeros((1, 1), np.int32), np.zeros(1, np.int32), 1.0, 4, variant="v3")
    assert mla.tiled_fits("v2")


def test_sm_count_and_split_plans():
    """The simulator answers an H200's 132 SMs; the MLA tiled kernels plan their key splits by waves of one block
    per SM, v1 for about SPLIT_TARGET blocks; a forced split count is taken as asked on every backend."""
    if kd.backend.name != "cuda":
        assert kd.backend.sm_count() == kd.backend.SIM_SM_COUNT == 132
        assert mla.plan_splits(17, 512, 32, 32, None, 132) == (1, 512)
    assert mla.tiled_wave() == kd.backend.sm_count() * mla.V2_MIN_BLOCKS < mla.SPLIT_TARGET
    assert mla.plan_splits(17, 512, 32, 32, 8, 132) == mla.plan_splits(17, 512, 32, 32, 8) == (8, 64)


@pytest.mark.parametrize("blocks, keys, want", [
    (2, 4097, (65, 64)),        # a Kimi decode step: one wave of two-tile splits (SPLIT_TARGET's: 129 of one)
    (34, 4113, (7, 608)),       # 4096 ctx, 16 nodes, 64 heads: 238 blocks in two full waves, not 136 in two
    (17, 512, (6, 96)),         # the default pair's verify over a 512-row cache: 102 blocks of 3 tiles
    (9, 529, (9, 64)),          # 512 ctx, 16 nodes, 16 heads: 81 blocks of 2 tiles, not 153 of one
    (514, 33057, (1, 33088)),   # more row tiles than SMs: one split, no combine
])
def test_wave_splits(blocks, keys, want):
    """wave_splits' plan on shapes measured on the H200 (docs/PERFORMANCE.md), 32-key tiles, 132 SMs."""
    assert mla.wave_splits(blocks, keys, 32, 32, 132) == want


def test_wave_splits_cover_the_keys():
    """Every plan covers the keys in whole tiles of at least min_len, with no empty split, and never costs more
    than one split per block or SPLIT_TARGET's plan by its own measure."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        blocks, keys = int(rng.integers(1, 600)), int(rng.integers(1, 40000))
        tile = int(rng.choice([16, 32]))
        wave = int(rng.integers(1, 200))
        n, length = mla.wave_splits(blocks, keys, tile, tile, wave)
        assert length % tile == 0 and length >= tile and n * length >= keys > (n - 1) * length, (blocks, keys)

        def cost(n, length):
            return -(-(blocks * n) // wave) * (length // tile + mla.BLOCK_TILES)
        one = -(-keys // tile) * tile
        assert cost(n, length) <= cost(1, one), (blocks, keys, tile, wave)


def test_short_decode_splits_run_v2():
    """variant=None runs v3 except on launches whose v2 splits would be single 16-key tiles (small decode grids,
    latency-bound: measured faster as v2); the choice depends on the grid the backend plans."""
    if kd.backend.name == "cuda":
        assert mla.short_splits(8, 300) and not mla.short_splits(64, 4097) and not mla.short_splits(16, 32768)
    else:                                              # one split per block: short only below two tiles of keys
        assert mla.short_splits(8, 16) and not mla.short_splits(8, 300)
