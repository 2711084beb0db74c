"""How ``_cublas`` cuts a GEMM of 17-80 rows into <= 16-row blocks (``_block_layout``; pure Python, no GPU): the
blocks cover every row once or, overlapping, at most nb - 1 rows twice, and never exceed 16 rows."""
import pytest

from kdtree_numba.kernels import _cublas


@pytest.mark.parametrize("M", range(_cublas.ROW_BLOCKS_MIN, 5 * _cublas.ROW_BLOCKS + 1))
def test_overlapping_blocks_cover_every_row_in_one_call(M):
    nb, m, s = _cublas._block_layout(M, overlap=True)
    assert 1 <= s <= m <= _cublas.ROW_BLOCKS
    assert (nb - 1) * s + m == M                      # the last block ends at the last row: no second call
    assert m - s < nb                                 # consecutive blocks share fewer than nb rows


@pytest.mark.parametrize("M", range(_cublas.ROW_BLOCKS_MIN, 5 * _cublas.ROW_BLOCKS + 1))
def test_disjoint_blocks_leave_the_rest_to_a_second_call(M):
    nb, m, s = _cublas._block_layout(M, overlap=False)
    assert s == m <= _cublas.ROW_BLOCKS and nb * m <= M
    assert M - nb * m < m                             # what is left is less than one block


@pytest.mark.parametrize("M, want", [(33, (3, 11, 11)), (65, (5, 13, 13)), (80, (5, 16, 16)),
                                     (17, (2, 9, 8)), (37, (3, 13, 12)), (47, (4, 14, 11))])
def test_examples(M, want):
    assert _cublas._block_layout(M, overlap=True) == want
    if want[1] == want[2]:                            # equal blocks fit: the same blocks either way
        assert _cublas._block_layout(M, overlap=False) == want
