"""The transport benchmark of `omnivox bench pipeline` runs its real processes and reports every
figure it prints (figures are not asserted: they depend on the machine)."""

from __future__ import annotations

import pytest

from agent.bench.transport import print_table, shm_vs_pickle

FIGURES = {"bytes", "shm_inplace_s", "inplace_ratio", "shm_pause_s", "write_s", "shm_s", "ratio",
           "pickle_s", "shm_ref_s"}


def test_every_way_moves_the_tensor_and_each_size_has_a_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sizes = [4 << 10, 64 << 10, 256 << 10]
    rows = shm_vs_pickle(sizes, repeats=3)  # a consumer that misread a tensor raises here
    assert [row["bytes"] for row in rows] == sizes
    for row in rows:
        assert set(row) == FIGURES
        assert all(row[key] > 0 for key in FIGURES - {"bytes"}), row
    print_table(rows)
    out = capsys.readouterr().out
    for size in sizes:
        assert f" {size} " in out
    assert "product path less the same pause, 64 KiB and up" in out
