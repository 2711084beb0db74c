"""Top-K draft log-probs and the token choice: ids exactly equal to the reference, values within fp32."""
import contextlib

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import logprobs as lpk
from kdtree_numba.kernels import sampling, topk_block as tb, topk_split as ts

from ..helpers import poisoned

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host


@pytest.mark.parametrize("kind,V,k", [("normal", 301, 7), ("normal", 129, 129), ("peaked", 260, 33),
                                      ("ties", 333, 40), ("uniform", 90, 17), ("neginf", 211, 50),
                                      ("signed_zero", 64, 5), ("normal", 4096, 64)])
def test_topk_matches_reference(kind, V, k):
    rng = np.random.default_rng(V + k)
    x = rng.standard_normal((3, V)).astype(np.float32)
    if kind == "peaked":
        x[:, 3] += 12
    elif kind == "ties":
        x = np.round(x * 2) / 2
    elif kind == "uniform":
        x[:] = 0.25
    elif kind == "neginf":
        x[:, ::3] = -np.inf
    elif kind == "signed_zero":
        x[:] = -1
        x[:, 10], x[:, 4] = -0.0, 0.0
    lp, ids = poisoned((3, k)), poisoned((3, k), "int32")
    lpk.topk_logprobs(x, k, out=(lp, ids))
    rlp, rids = lpk.topk_logprobs_ref(x, k)
    np.testing.assert_array_equal(H(ids), rids)
    np.testing.assert_allclose(H(lp), rlp, rtol=1e-5, atol=2e-6)
    assert np.all(np.diff(H(lp), axis=1) <= 0)


@pytest.mark.parametrize("k", [1, 7, 40, 64, 299, 300])
def test_host_topk_is_the_reference_bit_for_bit(k):
    """The NumPy backend's partition-then-sort path: the reference's ids and values exactly, ties (lowest ids
    first, also across the k-th value), -inf, signed zeros and k = V included."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((6, 300)).astype(np.float32)                     # [R, V]
    x[1] = np.round(x[1] * 2) / 2                                           # many ties at every value
    x[2] = 0.25                                                              # one value
    x[3, ::3] = -np.inf
    x[4] = -1
    x[4, 10], x[4, 4] = -0.0, 0.0
    x[5, 7:] = -np.inf                                                       # fewer finite values than k
    lp, ids = lpk.topk_logprobs_host(x, k)
    rlp, rids = lpk.topk_logprobs_ref(x, k)
    np.testing.assert_array_equal(ids, rids)
    np.testing.assert_array_equal(lp, rlp)
    assert ids.dtype == np.int32 and lp.dtype == np.float32


def test_block_threads_give_every_thread_two_fold_steps():
    """The one-block path's threads: the most (a power of two, 32..MAX_THREADS) that leave each thread >= 16
    columns; with fewer, a thread has no second top and the whole row becomes candidates."""
    for V in [1, 31, 511, 512, 1023, 1024, 4095, 4096, 4097, 8192, 32767, 163840]:
        t = tb.block_threads(V)
        assert 32 <= t <= tb.MAX_THREADS and t & (t - 1) == 0, (V, t)
        assert t == 32 or 16 * t <= V, (V, t)
        assert t == tb.MAX_THREADS or 32 * t > V, (V, t)
    assert tb.block_threads(4096) == 256


def test_topk_tie_overflow_takes_lowest_ids():
    """Uniform rows longer than the candidate buffer: every element reaches the threshold bin; the 4 local tops
    per thread (equal values ordered by index) still find the lowest ids."""
    V = tb.CAP + 37
    x = np.zeros((1, V), np.float32)
    x[0, [5, V - 1]] = 1.0
    lp, ids = lpk.topk_logprobs(x, 6)
    np.testing.assert_array_equal(H(ids)[0], [5, V - 1, 0, 1, 2, 3])
    np.testing.assert_allclose(H(lp), lpk.topk_logprobs_ref(x, 6)[0], rtol=1e-5)


def test_topk_sorts_many_candidates_with_the_bitonic_network():
    """More than RANK_SORT candidates (but within CAP): all values tie, so the threshold takes the whole row."""
    x = (np.random.default_rng(3).random((1, tb.RANK_SORT + 700)) < 0.7).astype(np.float32)
    lp, ids = lpk.topk_logprobs(x, 40)
    rlp, rids = lpk.topk_logprobs_ref(x, 40)
    np.testing.assert_array_equal(H(ids), rids)
    np.testing.assert_allclose(H(lp), rlp, rtol=1e-5, atol=1e-6)


def test_topk_radix_fallback_when_the_threshold_bin_overflows():
    """Rows where more than CAP elements reach the threshold bin and one thread holds more than four of the top
    k: the radix fallback, including its ordered scan when the ties at the threshold overflow the buffer."""
    stride = kd.backend.block_size(tb.MAX_THREADS, 32)        # the kernel's threads per row
    V = tb.CAP + 3 * stride
    x = np.zeros((2, V), np.float32)
    x[0, [0, stride, 2 * stride, 3 * stride, 4 * stride]] = 1.0           # row 0: ties overflow -> ordered scan
    # row 1 (distinct values): six huge values in one thread's stride stretch the histogram, so the threshold bin
    # holds the whole row, and defeat the 4-local-tops pass -> plain radix refinement
    x[1] = np.random.default_rng(9).random(V).astype(np.float32)
    x[1, [j * stride for j in range(6)]] = 1000.0 + np.arange(6)
    lp, ids = lpk.topk_logprobs(x, 10)
    rlp, rids = lpk.topk_logprobs_ref(x, 10)
    np.testing.assert_array_equal(H(ids), rids)
    np.testing.assert_array_equal(H(ids)[0], [0, stride, 2 * stride, 3 * stride, 4 * stride, 1, 2, 3, 4, 5])
    np.testing.assert_allclose(H(lp), rlp, rtol=1e-5, atol=1e-6)


def test_topk_rejects_nan_and_bad_k():
    x = np.zeros((2, 10), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(ValueError, match="k: expected an integer <= 10"):
        lpk.topk_logprobs(np.zeros((2, 10), np.float32), 11)
    if kd.backend.name == "cuda":            # no host check on the GPU (no sync): a NaN row comes back as -1 ids
        lp, ids = lpk.topk_logprobs(kd.backend.asarray(x), 3)
        np.testing.assert_array_equal(H(ids), [[0, 1, 2], [-1, -1, -1]])
        assert np.isnan(H(lp)[1]).all()
        return
    with pytest.raises(ValueError, match="row 1 contains NaN"):
        lpk.topk_logprobs(x, 3)
    with pytest.raises(ValueError, match="no finite value"):
        lpk.topk_logprobs(np.full((1, 4), -np.inf, np.float32), 2)
    with pytest.raises(ValueError, match="row 0 contains \\+inf"):
        lpk.topk_logprobs(np.array([[0, np.inf, 1]], np.float32), 2)


def test_choose_argmax_and_samples_match_reference():
    rng = np.random.default_rng(21)
    x = rng.standard_normal((5, 77)).astype(np.float32)
    x[2, [3, 40]] = 9.0                                                 # tie: lowest id
    np.testing.assert_array_equal(H(sampling.choose_tokens(x, 0.0)), sampling.choose_tokens_ref(x, 0.0))
    assert H(sampling.choose_tokens(x, 0.0))[2] == 3
    for seed, stream in ((0, 0), (7, 3), (2 ** 40 + 5, 11)):
        got = H(sampling.choose_tokens(x, 0.8, seed, stream))
        np.testing.assert_array_equal(got, sampling.choose_tokens_ref(x, 0.8, seed, stream))
    a = H(sampling.choose_tokens(x, 1.0, 1, 0))
    assert not np.array_equal(a, H(sampling.choose_tokens(x, 1.0, 2, 0))) or not np.array_equal(
        a, H(sampling.choose_tokens(x, 1.0, 1, 1)))                     # seeds and streams change draws
    bad = x.copy()
    bad[4, 0] = np.nan
    assert H(sampling.choose_tokens(bad, 0.0))[4] == -1


@pytest.mark.parametrize("chunk", [16, 25, 77])
def test_choose_split_over_chunks_is_the_one_block_choice(chunk):
    """Rows longer than ``chunk`` go through chunk maxima, chunk winners and a pick among them: the same tokens as
    the reference (ties across chunks: the lower id; T > 0 scores against the whole row's max; NaN in one chunk)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 77)).astype(np.float32)                  # [3, 77]: 5, 4 and 1 chunks
    x[0, [20, 60]] = 9.0                                                 # a tie in two different chunks
    x[2, 70] = np.nan
    want0 = sampling.choose_tokens_ref(x, 0.0)
    got0 = H(sampling.choose_tokens(x, 0.0, chunk=chunk))
    np.testing.assert_array_equal(got0, want0)
    assert got0[0] == 20 and got0[2] == -1
    got = H(sampling.choose_tokens(x, 0.7, 9, 4, chunk=chunk))
    np.testing.assert_array_equal(got, sampling.choose_tokens_ref(x, 0.7, 9, 4))
    for name in (kd.backend.process_name, "numpy"):                     # refused before any backend work
        with kd.backend.use(name), pytest.raises(ValueError, match="chunk: expected"):
            sampling.choose_tokens(x, 0.0, chunk=0)


@pytest.mark.parametrize("chunk", [77, 25])
def test_row_streams_key_each_row_by_its_position(chunk):
    """``row_streams``: row r draws from stream + row_streams[r] with counter row 0 - the kernel (one block a row,
    and chunked) equals the reference; rows with the same key and logits choose alike; and a row keyed p draws what
    a one-row call at stream p draws (a decode step at that position), which is why DDTree's tokens are plain
    decoding's at T > 0."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((4, 77)).astype(np.float32)
    x[2] = x[1]                                                          # two siblings' rows (same logits)
    rs = np.array([0, 1, 1, 2], np.int32)                                # depths: root, two children, a grandchild
    got = H(sampling.choose_tokens(x, 1.1, 6, 40, chunk=chunk, row_streams=kd.backend.asarray(rs)))
    np.testing.assert_array_equal(got, sampling.choose_tokens_ref(x, 1.1, 6, 40, row_streams=rs))
    assert got[1] == got[2]
    for r in range(4):
        one = H(sampling.choose_tokens(x[r:r + 1], 1.1, 6, 40 + int(rs[r]), chunk=chunk))
        assert one[0] == got[r]
    keyed = [sampling.choose_tokens_ref(x, 1.1, s, 40, row_streams=rs) for s in range(8)]
    plain = [sampling.choose_tokens_ref(x, 1.1, s, 40) for s in range(8)]
    assert any(not np.array_equal(a, b) for a, b in zip(keyed, plain))  # the keys change the draws
    with pytest.raises(ValueError, match="row_streams"):
        sampling.choose_tokens(x, 1.1, 6, 40, row_streams=kd.backend.asarray(rs[:3]))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [0.0, 0.8])
def test_choose_split_over_chunks_replays_from_a_cuda_graph(T):
    """The chunked path (its partials allocated during the capture, kept by CapturedStep) inside a CUDA graph:
    replays with new logits written in place and a new stream give the reference's tokens, as a captured Kimi
    decode step does (163840 columns = 40 chunks)."""
    from kdtree_numba.decode.replay import CapturedStep
    rng = np.random.default_rng(8)
    x = kd.backend.asarray(rng.standard_normal((3, 163840)).astype(np.float32))      # [3, V]
    stream = kd.backend.asarray(np.array([0], np.int32))                             # [1] device-side stream
    out = kd.backend.empty((3,), np.int32)
    sampling.choose_tokens(x, T, 5, stream, out=out)                                 # direct once: compile
    step = CapturedStep(lambda: sampling.choose_tokens(x, T, 5, stream, out=out), "the sampler")
    for r in range(3):
        new = rng.standard_normal((3, 163840)).astype(np.float32)
        new[1, 100000 + r] = 50.0                                                    # a clear winner in chunk 24
        x[...] = kd.backend.asarray(new)
        stream[...] = r
        step.replay()
        np.testing.assert_array_equal(H(out), sampling.choose_tokens_ref(new, T, 5, r))


def test_sampler_uniforms_are_uniform():
    u = sampling.uniforms_ref(3, 1, 0, 200_000)
    assert 0 < u.min() and u.max() < 1
    hist = np.histogram(u, bins=20, range=(0, 1))[0]
    assert np.abs(hist - 10_000).max() < 500


@pytest.mark.parametrize("kind,V,k,chunk", [("normal", 301, 7, 64), ("peaked", 260, 33, 100), ("ties", 333, 40, 128),
                                            ("neginf", 211, 50, 64), ("uniform", 90, 17, 32)])
def test_topk_split_over_blocks_matches_reference(kind, V, k, chunk):
    """The several-blocks-per-row launches (used when there are few rows) give the same ids as the reference."""
    rng = np.random.default_rng(V * k)
    x = rng.standard_normal((2, V)).astype(np.float32)
    if kind == "peaked":
        x[:, 3] += 12
    elif kind == "ties":
        x = np.round(x * 2) / 2
    elif kind == "neginf":
        x[:, ::3] = -np.inf
    elif kind == "uniform":
        x[:] = 0.25
    lp, ids = poisoned((2, k)), poisoned((2, k), "int32")
    ts._launch_split(kd.backend.asarray(x), k, lp, ids, chunk)
    rlp, rids = lpk.topk_logprobs_ref(x, k)
    np.testing.assert_array_equal(H(ids), rids)
    np.testing.assert_allclose(H(lp), rlp, rtol=1e-5, atol=2e-6)


def test_topk_split_refines_the_block_bound_for_large_k():
    """k above the thread tops of a block (2 x threads): every staged element reaches the tops bound, so the block
    refines it with a histogram of its elements and appends about k per block, not its whole chunk."""
    rng = np.random.default_rng(5)
    k, chunk, S = 80, 600, 3                 # the simulator's 32 threads have 64 tops
    x = rng.standard_normal((2, 1500)).astype(np.float32)
    lp, ids = poisoned((2, k)), poisoned((2, k), "int32")
    ts._launch_split(kd.backend.asarray(x), k, lp, ids, chunk)
    rlp, rids = lpk.topk_logprobs_ref(x, k)
    np.testing.assert_array_equal(H(ids), rids)
    np.testing.assert_allclose(H(lp), rlp, rtol=1e-5, atol=2e-6)
    # the streaming kernel alone: every block refined to at most k + k/4 + 64 candidates, holding the top k
    limit = k + k // 4 + 64
    B = kd.backend
    width = S * limit + 4 * ts.MAX_THREADS                           # as _launch_split pads it
    part, cand_v = B.empty((2, S, 4), np.float32), B.empty((2, width), np.float32)
    cand_i, count = B.empty((2, width), np.int32), B.asarray(np.zeros(2, np.int32))
    xd = B.asarray(x)                        # held until the results are read: a temporary freed right after the
    B.launch(ts._split_scan_kernel, 2 * S, ts.SPLIT_THREADS, xd, k, S, chunk, limit,   # asynchronous launch
             part, cand_v, cand_i, count, shared=4 * chunk)                          # reads as freed to memcheck
    n = H(part)[:, :, 2].astype(int)                              # listed per block
    assert (n >= k).all() and (n <= limit).all(), n               # unrefined, each block would list 600 or 300
    np.testing.assert_array_equal(H(count), n.sum(axis=1))
    for r in range(2):
        assert set(rids[r]) <= set(H(cand_i)[r, :n[r].sum()].tolist())


def test_topk_split_overflow_and_nan_rows():
    """Split launches: a row whose candidates overflow runs the one-block algorithm; a NaN row gives -1 ids."""
    V = ts.CAP + 100
    x = np.zeros((2, V), np.float32)
    x[0, [5, V - 1]] = 1.0
    x[1, 7] = np.nan
    lp, ids = poisoned((2, 6)), poisoned((2, 6), "int32")
    ts._launch_split(kd.backend.asarray(x), 6, lp, ids, 2048)
    np.testing.assert_array_equal(H(ids)[0], [5, V - 1, 0, 1, 2, 3])
    assert (H(ids)[1] == -1).all() and np.isnan(H(lp)[1]).all()


def test_topk_split_rows_with_fewer_finite_values_than_k():
    """Blocks holding fewer than k finite values: their k-th largest is -inf, so their bound must be -inf too
    (the refinement once took the smallest finite value as the bound, dropping the -inf elements of the top k)."""
    rng = np.random.default_rng(11)
    k, chunk = 80, 600                       # above the simulator's 64 thread tops: the blocks refine their bound
    x = np.full((2, 1500), -np.inf, np.float32)
    x[0, rng.choice(600, 50, replace=False)] = rng.standard_normal(50)       # 50 finite values, all in block 0
    x[1, rng.choice(1500, 120, replace=False)] = rng.standard_normal(120)    # 120 spread over the three blocks
    lp, ids = poisoned((2, k)), poisoned((2, k), "int32")
    ts._launch_split(kd.backend.asarray(x), k, lp, ids, chunk)
    rlp, rids = lpk.topk_logprobs_ref(x, k)
    np.testing.assert_array_equal(H(ids), rids)
    np.testing.assert_allclose(H(lp), rlp, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("backend_name", ["kernel", "numpy"])
def test_vanishing_temperature_samples_the_argmax(backend_name):
    """T = 1e-308 is greedy in the limit: x / T used to overflow to inf for every logit above ~1.8, and the
    first of those won whatever its value."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 77)) * 4 + 10).astype(np.float32)          # every logit far above 1.8
    with kd.backend.use("numpy") if backend_name == "numpy" else contextlib.nullcontext():
        for T in (1e-308, 5e-324, 1e-30):
            got = kd.backend.to_host(sampling.choose_tokens(x, T, seed=1, stream=2))
            np.testing.assert_array_equal(got, np.argmax(x, axis=1))
