"""A lane's shape (what a queue entry asks for, per priority band) as the queue's Lua
writes it, read back into bands and said in words for the console's Queue page."""

from __future__ import annotations

import pytest

from fairshare.queue.calls import shape_bands, shape_in_words


def test_a_shape_is_read_band_by_band_in_order() -> None:
    assert shape_bands("t/gpu=1+b/gpu=3") == [("training", {"gpu": 1}),
                                               ("borrowed", {"gpu": 3})]
    assert shape_bands("i/gpu=2,mig-1g.5gb=1") == [("inference",
                                                    {"gpu": 2, "mig-1g.5gb": 1})]


@pytest.mark.parametrize(("shape", "words"), [
    ("t/gpu=1+b/gpu=3", "1 GPU training + 3 GPUs borrowed"),
    ("b/gpu=4", "4 GPUs borrowed"),
    ("i/mig-1g.5gb=2", "2 MIG 1g.5gb inference"),
    ("t/gpu=2,mig-3g.40gb=1", "2 GPUs training + 1 MIG 3g.40gb training"),
    ("t/mig-1g.5gb#single=7", "7 MIG 1g.5gb (MIG single 1g.5gb) training"),
    ("i/gpu@a=1", "1 GPU (whole GPUs in pool a) inference"),
])
def test_a_shape_is_said_in_words(shape: str, words: str) -> None:
    assert shape_in_words(shape) == words
