"""Pausing Python's cyclic garbage collector through a burst of allocation.

Building thousands of records (a listing page in gqd, the decoded pages and rows of `gq queue`)
sets off a collection every few hundred new containers, and each walks the long-lived objects
too: about half of gqd's time for a page with 100,000 jobs queued, and a third of `gq queue`'s
CPU. Such records hold no cycles: reference counting frees them all the same.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside the block (the rare cycle made there waits for the next
    one after it); nested blocks and a collector already off are left as they were."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
