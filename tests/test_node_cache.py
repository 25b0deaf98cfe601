"""gqnode's warm cache keys (gq/node/cache.py): a bounded LRU per GPU sized by its VRAM, cache directories, what
a launch was (GQ_CACHE_WARM) and what a heartbeat says; `[node] cache_keys_per_gpu` checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from gq import config
from gq.errors import ConfigError
from gq.node.cache import WarmCache


def test_each_gpu_keeps_its_most_recent_keys_up_to_the_bound() -> None:
    cache = WarmCache(per_gpu=2)
    assert cache.launch([0], None) is None  # no key: no GQ_CACHE_WARM
    assert cache.launch([0], "A") is False
    assert cache.launch([0], "A") is True
    assert cache.launch([0, 1], "A") is False  # warm on 0, cold on 1: a cold start
    cache.launch([0], "B")
    cache.launch([0], "C")  # A is now the least recent on GPU 0: dropped
    assert cache.report([0, 1, 2]) == {"0": ["C", "B"], "1": ["A"]}
    cache.launch([0], "B")
    assert cache.report([0]) == {"0": ["B", "C"]}
    assert WarmCache(per_gpu=0).launch([0], "A") is False


def test_a_gpu_keeps_as_many_keys_as_fit_in_its_vram() -> None:
    gib = 1 << 30
    cache = WarmCache(per_gpu=4, vram={0: 80 * gib, 1: 24 * gib})
    cache.launch([0], "A", 40 * gib)
    cache.launch([0], "B", 30 * gib)
    assert cache.report([0]) == {"0": ["B", "A"]}  # 70 of 80 GiB
    cache.launch([0], "C", 20 * gib)  # 90 GiB: A, the least recent, no longer fits
    assert cache.report([0]) == {"0": ["C", "B"]}
    assert cache.launch([0], "A", 40 * gib) is False
    # Small models: up to the cap (4) however many would fit.
    for key in "DEFGH":
        cache.launch([0], key, gib)
    assert cache.report([0]) == {"0": ["H", "G", "F", "E"]}
    # 10 + 20 GiB do not fit in 24; without --gpu-mem a key counts against the cap only.
    cache.launch([1], "X", 10 * gib)
    cache.launch([1], "Y", 20 * gib)
    assert cache.report([1]) == {"1": ["Y"]}
    cache.launch([1], "Z")
    cache.launch([1], "W")
    assert cache.report([1]) == {"1": ["W", "Z", "Y"]}
    # A key bigger than the GPU stays while it is the newest (it is loaded now).
    cache.launch([1], "V", 30 * gib)
    assert cache.report([1]) == {"1": ["V"]}
    # A GPU of unknown size: the cap alone.
    for key in "PQRST":
        cache.launch([2], key, 100 * gib)
    assert cache.report([2]) == {"2": ["T", "S", "R", "Q"]}


def test_cache_dirs_name_keys_warm_on_every_gpu(tmp_path: Path) -> None:
    (tmp_path / "llama-70b").mkdir()
    (tmp_path / ".partial").mkdir()
    (tmp_path / "README").write_text("not a key")
    cache = WarmCache(per_gpu=4, dirs=[str(tmp_path), str(tmp_path / "missing")])
    assert cache.report([0, 1]) == {"0": ["llama-70b"], "1": ["llama-70b"]}
    assert cache.launch([1], "llama-70b") is True
    cache.launch([1], "sdxl")
    assert cache.report([1]) == {"1": ["sdxl", "llama-70b"]}


def test_cache_keys_per_gpu_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "gq.toml"
    path.write_text("[node]\ncache_keys_per_gpu = 8\ncache_dirs = [\"/models\"]\n")
    cfg = config.load(path)
    assert (cfg.node.cache_keys_per_gpu, cfg.node.cache_dirs) == (8, ["/models"])
    path.write_text("[node]\ncache_keys_per_gpu = -1\n")
    with pytest.raises(ConfigError, match="cache_keys_per_gpu"):
        config.load(path)
