"""The warp / block primitives (kernels/primitives.py), each in a tiny test kernel vs NumPy: warp collectives and
arg-max with ties, the group collectives at every width, the asynchronous copy (kernels/_intrinsics.py) at both
widths with zero fill, the block collectives, the shared-memory tree reductions (the float sum bit for bit against the
same tree in NumPy), the scan at block sizes off a power of two, the bitonic sort at any n, the softmax step."""
import numpy as np
import pytest
from numba import cuda, float32, int32, uint64

import kdtree_numba as kd
from kdtree_numba.kernels import primitives as P
from kdtree_numba.kernels._intrinsics import copy_async, copy_async_wait

from ..helpers import poisoned

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host
A = kd.backend.asarray
TILE_ALIGN = None if P.SIM else 16   # the simulator takes no alignment argument
GROUP_BUF = P.GROUP_BUF   # shared sizes must be module constants on a GPU
MAXT = 64                  # the largest test block (shared sizes must be literals on a GPU)
MAXW = 2                   # its warps
SORT_MAX = 128             # keys per sorted row
NEG = -np.inf


# ------------------------------------------------------------------------------------------------ test kernels
@cuda.jit
def _warp_kernel(xf, xi, xv, xj, src, out_f, out_i):
    """Block b (one warp): lane t holds xf[b, t], xi[b, t] and the arg-max candidate (xv, xj)[b, t]."""
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    fbuf = cuda.shared.array(32, float32)
    ibuf = cuda.shared.array(32, int32)
    v = xf[b, t]
    c = xi[b, t]
    out_f[b, t, 0] = P.warp_sum(v, fbuf)
    out_f[b, t, 1] = P.warp_max(v, fbuf)
    out_f[b, t, 2] = P.warp_min(v, fbuf)
    out_f[b, t, 3] = P.warp_bcast(v, src[b], fbuf)
    out_f[b, t, 5] = P.warp_xor(v, 1 << (2 * b), fbuf)           # lane t ^ 1, t ^ 4, t ^ 16 in blocks 0, 1, 2
    before, total = P.warp_prefix_sum(c, ibuf)
    out_i[b, t, 0] = before
    out_i[b, t, 1] = total
    out_i[b, t, 2] = P.warp_suffix_sum(c, ibuf)
    bv, bi = P.warp_argmax(xv[b, t], xj[b, t], fbuf, ibuf)
    out_f[b, t, 4] = bv
    out_i[b, t, 3] = bi


@cuda.jit
def _block_kernel(xf, xi, out_f, out_i):
    """Whole warps (one on the simulator): block_min, block_prefix_sum, block_suffix_sum of row b."""
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    nwarps = cuda.blockDim.x // 32
    fbuf = cuda.shared.array(32, float32)
    ibuf = cuda.shared.array(32, int32)
    wf = cuda.shared.array(MAXW, float32)
    wi = cuda.shared.array(MAXW, int32)
    out_f[b, t] = P.block_min(xf[b, t], wf, nwarps, fbuf)
    before, total = P.block_prefix_sum(xi[b, t], wi, ibuf)
    cuda.syncthreads()                            # wi is written again
    out_i[b, t, 0] = before
    out_i[b, t, 1] = total
    out_i[b, t, 2] = P.block_suffix_sum(xi[b, t], wi, nwarps, ibuf)


@cuda.jit
def _smem_kernel(xf, xv, xj, out_f, out_i):
    """Blocks of a power of two: smem_sum, smem_max of xf[b], smem_argmax of the candidates (xv, xj)[b]."""
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    red_f = cuda.shared.array(MAXT, float32)
    red_i = cuda.shared.array(MAXT, int32)
    out_f[b, t, 0] = P.smem_sum(xf[b, t], red_f)
    cuda.syncthreads()
    out_f[b, t, 1] = P.smem_max(xf[b, t], red_f)
    cuda.syncthreads()
    bv, bi = P.smem_argmax(xv[b, t], xj[b, t], red_f, red_i)
    out_f[b, t, 2] = bv
    out_i[b, t] = bi


@cuda.jit
def _scan_kernel(xi, out_i):
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    red = cuda.shared.array(MAXT, int32)
    before, total = P.smem_prefix_sum(xi[b, t], red)
    out_i[b, t, 0] = before
    out_i[b, t, 1] = total


@cuda.jit
def _sort_kernel(keys_u, keys_f, ns):
    """Row b: the first ns[b] keys sorted in shared memory, the rest copied through untouched."""
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    ku = cuda.shared.array(SORT_MAX, uint64)
    kf = cuda.shared.array(SORT_MAX, float32)
    for i in range(t, SORT_MAX, cuda.blockDim.x):
        ku[i] = keys_u[b, i]
        kf[i] = keys_f[b, i]
    cuda.syncthreads()
    P.bitonic_sort_desc(ku, ns[b])
    P.bitonic_sort_desc(kf, ns[b])
    for i in range(t, SORT_MAX, cuda.blockDim.x):
        keys_u[b, i] = ku[i]
        keys_f[b, i] = kf[i]


@cuda.jit
def _softmax_kernel(sc, m_run, l_run, alpha):
    """Thread h: the tiles sc[0], sc[1], ... of row h in turn; alpha[tile, h] after each."""
    h = cuda.threadIdx.x
    for tile in range(sc.shape[0]):
        P.online_softmax_row(sc[tile], h, sc.shape[2], m_run, l_run, alpha[tile])


# ------------------------------------------------------------------------------------------------ helpers
def _candidates(rng, B, n, n_values=4):
    """Arg-max candidates (value, index) with many ties and indices out of lane order; some threads have none
    (-inf, n)."""
    v = rng.integers(0, n_values, (B, n)).astype(np.float32)
    j = np.stack([rng.permutation(n) for _ in range(B)]).astype(np.int32)
    none = rng.random((B, n)) < 0.2
    v[none], j[none] = NEG, n
    return v, j


def _argmax_ref(v, j):
    """Per row: the largest value, ties to the lowest index."""
    best = [min(zip(-vr.astype(np.float64), jr))[::-1] for vr, jr in zip(v, j)]
    return np.array([-b[1] for b in best], np.float32), np.array([b[0] for b in best], np.int32)


def _tree_sum_ref(x):
    """smem_sum's pairing: level by level, red[t] += red[t + s], s = n/2 .. 1, in float32."""
    red = np.array(x, np.float32)
    s = red.shape[-1] // 2
    while s:
        red[..., :s] += red[..., s:2 * s]
        s //= 2
    return red[..., 0]


@cuda.jit
def _group_kernel(x, out):
    """Two warps; block b reduces over groups of width 2 << b: out[b, t] = (group max, group sum) of x[t]."""
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    buf = cuda.shared.array(GROUP_BUF, float32)
    width = 2 << b
    out[b, t, 0] = P.group_max(x[t], width, buf)
    out[b, t, 1] = P.group_sum(x[t], width, buf)


@cuda.jit
def _copy_kernel(src, rows, width, out):
    """Row rows[j] of src (or zeros where rows[j] < 0) -> row j of a 16-byte aligned shared tile with a padded
    stride of 12 floats, by copies of ``width`` floats; then the tile -> out."""
    tile = cuda.shared.array((4, 12), float32, alignment=TILE_ALIGN)
    t = cuda.threadIdx.x
    D = src.shape[1]
    for p in range(t, 4 * (D // width), cuda.blockDim.x):
        j = p // (D // width)
        c = p % (D // width) * width
        copy_async(tile, uint64(j * 12 + c), src, uint64(max(rows[j], 0) * D + c), width, rows[j] >= 0)
    copy_async_wait()
    cuda.syncthreads()
    for p in range(t, 4 * D, cuda.blockDim.x):
        out[p // D, p % D] = tile[p // D, p % D]


def _exclusive(c):
    return np.cumsum(c, axis=-1) - c


# ------------------------------------------------------------------------------------------------ tests
def test_warp_collectives_and_argmax_ties(rng=np.random.default_rng(0)):
    B = 3
    xf = rng.integers(-50, 50, (B, 32)).astype(np.float32)       # integers: sums exact in any order
    xi = rng.integers(0, 4, (B, 32)).astype(np.int32)
    xi[0] = [1, 0, 2] + [0] * 29                                   # the docstring's example
    xv, xj = _candidates(rng, B, 32)
    xv[1], xj[1] = [5, 7, 7, 1] + [NEG] * 28, list(range(32))      # the docstring's arg-max example
    src = np.array([0, 17, 31], np.int32)
    out_f, out_i = poisoned((B, 32, 6)), poisoned((B, 32, 4), "int32")
    kd.backend.launch(_warp_kernel, B, 32, A(xf), A(xi), A(xv), A(xj), A(src), out_f, out_i)
    f, i = H(out_f), H(out_i)
    col = np.ones((1, 32))
    np.testing.assert_array_equal(f[..., 0], xf.sum(1)[:, None] * col)
    np.testing.assert_array_equal(f[..., 1], xf.max(1)[:, None] * col)
    np.testing.assert_array_equal(f[..., 2], xf.min(1)[:, None] * col)
    np.testing.assert_array_equal(f[..., 3], xf[np.arange(B), src][:, None] * col)
    for b in range(B):
        np.testing.assert_array_equal(f[b, :, 5], xf[b, np.arange(32) ^ (1 << (2 * b))])
    np.testing.assert_array_equal(i[..., 0], _exclusive(xi))
    np.testing.assert_array_equal(i[..., 1], xi.sum(1)[:, None] * col)
    np.testing.assert_array_equal(i[..., 2], np.cumsum(xi[:, ::-1], axis=1)[:, ::-1])
    np.testing.assert_array_equal(i[0, :4, 0], [0, 1, 1, 3])
    bv, bj = _argmax_ref(xv, xj)
    np.testing.assert_array_equal(f[..., 4], bv[:, None] * col)
    np.testing.assert_array_equal(i[..., 3], bj[:, None] * col)
    assert (f[1, 0, 4], i[1, 0, 3]) == (7, 1)


def test_group_collectives_every_width(rng=np.random.default_rng(6)):
    x = rng.integers(-50, 50, 64).astype(np.float32)                 # integers: sums exact in any order
    out = poisoned((5, 64, 2))
    kd.backend.launch(_group_kernel, 5, 64, A(x), out)
    for b in range(5):
        w = 2 << b                                                   # 2, 4, 8, 16, 32 lanes
        groups = x.reshape(-1, w)
        np.testing.assert_array_equal(H(out)[b, :, 0], np.repeat(groups.max(1), w))
        np.testing.assert_array_equal(H(out)[b, :, 1], np.repeat(groups.sum(1), w))


@pytest.mark.parametrize("width", [4, 1])
def test_copy_async_rows_and_zero_fill(width, rng=np.random.default_rng(7)):
    src = rng.standard_normal((6, 8)).astype(np.float32)
    rows = np.array([5, -1, 0, 3], np.int32)                         # row 1: zero fill
    out = poisoned((4, 8))
    kd.backend.launch(_copy_kernel, 1, 32, A(src), A(rows), width, out)
    want = src[np.maximum(rows, 0)] * (rows >= 0)[:, None]
    np.testing.assert_array_equal(H(out), want)


def test_block_min_and_block_scans(rng=np.random.default_rng(1)):
    n = kd.backend.block_size(MAXT, 32)                # two warps on a GPU, one on the simulator
    B = 2
    xf = rng.standard_normal((B, n)).astype(np.float32)
    xi = rng.integers(0, 5, (B, n)).astype(np.int32)
    xi[1] = 1
    out_f, out_i = poisoned((B, n)), poisoned((B, n, 3), "int32")
    kd.backend.launch(_block_kernel, B, n, A(xf), A(xi), out_f, out_i)
    f, i = H(out_f), H(out_i)
    np.testing.assert_array_equal(f, np.repeat(xf.min(1, keepdims=True), n, 1))
    np.testing.assert_array_equal(i[..., 0], _exclusive(xi))
    np.testing.assert_array_equal(i[..., 1], np.repeat(xi.sum(1, keepdims=True), n, 1))
    np.testing.assert_array_equal(i[..., 2], np.cumsum(xi[:, ::-1], axis=1)[:, ::-1])
    np.testing.assert_array_equal(i[1, :, 2], n - np.arange(n))          # all ones -> n - t


@pytest.mark.parametrize("n", [8, 64])
def test_smem_reductions_and_argmax_ties(n, rng=np.random.default_rng(2)):
    B = 3
    xf = rng.standard_normal((B, n)).astype(np.float32)
    xf[2, n // 2] = np.inf
    xv, xj = _candidates(rng, B, n)
    xv[0], xj[0] = NEG, n                                          # no candidate anywhere: (-inf, n)
    xv[1, [2, 5]] = 9                                              # a tied maximum, the lower index in the
    xj[1, [2, 5]] = sorted(xj[1, [2, 5]])[::-1]                    # higher thread
    out_f, out_i = poisoned((B, n, 3)), poisoned((B, n), "int32")
    kd.backend.launch(_smem_kernel, B, n, A(xf), A(xv), A(xj), out_f, out_i)
    f, i = H(out_f), H(out_i)
    np.testing.assert_array_equal(f[..., 0], np.repeat(_tree_sum_ref(xf)[:, None], n, 1))    # bit for bit
    np.testing.assert_allclose(f[:2, 0, 0], xf[:2].sum(1), rtol=1e-5)
    np.testing.assert_array_equal(f[..., 1], np.repeat(xf.max(1, keepdims=True), n, 1))
    bv, bj = _argmax_ref(xv, xj)
    np.testing.assert_array_equal(f[..., 2], np.repeat(bv[:, None], n, 1))
    np.testing.assert_array_equal(i, np.repeat(bj[:, None], n, 1))
    assert bj[0] == n


@pytest.mark.parametrize("n", [5, 37])
def test_smem_prefix_sum_off_a_power_of_two(n, rng=np.random.default_rng(3)):
    xi = rng.integers(0, 4, (2, n)).astype(np.int32)
    if n == 5:
        xi[0] = [1, 0, 2, 0, 3]                                    # the docstring's example
    out = poisoned((2, n, 2), "int32")
    kd.backend.launch(_scan_kernel, 2, n, A(xi), out)
    o = H(out)
    np.testing.assert_array_equal(o[..., 0], _exclusive(xi))
    np.testing.assert_array_equal(o[..., 1], np.repeat(xi.sum(1, keepdims=True), n, 1))
    if n == 5:
        np.testing.assert_array_equal(o[0, :, 0], [0, 1, 1, 3, 3])


def test_bitonic_sort_any_n_with_duplicates(rng=np.random.default_rng(4)):
    ns = np.array([0, 1, 2, 5, 16, 37, 100, SORT_MAX], np.int32)
    B = ns.size
    ku = rng.integers(0, 40, (B, SORT_MAX)).astype(np.uint64) << np.uint64(33)    # many ties, high bits in use
    kf = rng.integers(-6, 6, (B, SORT_MAX)).astype(np.float32) / np.float32(4)
    kf[6, :3] = [-np.inf, np.inf, 0.0]
    ku[3, :5], kf[3, :5] = [3, 9, 1, 9, 4], [3, 9, 1, 9, 4]       # the docstring's example
    du, df = A(ku.copy()), A(kf.copy())
    kd.backend.launch(_sort_kernel, B, kd.backend.block_size(32, 16), du, df, A(ns))
    gu, gf = H(du), H(df)
    for b, n in enumerate(ns):
        np.testing.assert_array_equal(gu[b, :n], np.sort(ku[b, :n])[::-1])
        np.testing.assert_array_equal(gf[b, :n], np.sort(kf[b, :n])[::-1])
        np.testing.assert_array_equal(gu[b, n:], ku[b, n:])                    # past n: untouched
        np.testing.assert_array_equal(gf[b, n:], kf[b, n:])
    np.testing.assert_array_equal(gu[3, :5], [9, 9, 4, 3, 1])


def test_online_softmax_row_over_two_tiles(rng=np.random.default_rng(5)):
    tiles, rows, n = 2, 3, 5
    x = rng.standard_normal((tiles, rows, n)).astype(np.float32) * 3
    x[1, 0] -= 20                                                   # row 0: the second tile holds no new max
    sc, m, l, alpha = A(x.copy()), A(np.full(rows, -np.inf, np.float32)), A(np.zeros(rows, np.float32)), \
        poisoned((tiles, rows))
    kd.backend.launch(_softmax_kernel, 1, rows, sc, m, l, alpha)
    m_prev = np.full(rows, -np.inf)
    l_ref = np.zeros(rows)
    for t in range(tiles):
        M = np.maximum(m_prev, x[t].max(1))
        a = np.exp(m_prev - M)
        np.testing.assert_allclose(H(alpha)[t], a, rtol=1e-6)
        np.testing.assert_allclose(H(sc)[t], np.exp(x[t] - M[:, None]), rtol=1e-6)
        l_ref = l_ref * a + np.exp(x[t] - M[:, None]).sum(1)
        m_prev = M
    np.testing.assert_array_equal(H(m), x.max(axis=(0, 2)))
    np.testing.assert_allclose(H(l), l_ref, rtol=1e-5)
    assert H(alpha)[1, 0] == 1.0
