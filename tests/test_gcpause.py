"""gq.gcpause: the collector is off inside the block and as it was after it."""

from __future__ import annotations

import gc

import pytest

from gq import gcpause


def test_paused_turns_collection_off_and_back_on_even_after_an_error():
    assert gc.isenabled()
    with pytest.raises(ValueError), gcpause.paused():
        assert not gc.isenabled()
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block leaves the outer one's pause alone
        raise ValueError
    assert gc.isenabled()


def test_paused_leaves_a_collector_already_off_off():
    gc.disable()
    try:
        with gcpause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
