"""Which cache keys (`--cache-key`: what a job loads, a model's name) are warm on each of this
node's GPUs, for model affinity (docs/SCHEDULING.md).

Per GPU, the keys of its most recent jobs, newest last: an LRU sized by the GPU's VRAM, because
a GPU's memory holds only so many models at a time and an older key is more likely gone than
warm. Each key takes the VRAM its job asked for (`--gpu-mem`), and a GPU keeps its most recent
keys while their sum fits in its memory, at most `[node] cache_keys_per_gpu` of them (the cap;
a key whose job gave no --gpu-mem counts against the cap only, as the size is unknown). Besides, each subdirectory of a `[node] cache_dirs` entry names a key
warm on every GPU of the node (weights already on local disk). The set is kept in memory only:
after a gqnode restart its LRUs start empty (the worst that does is one cold start more), and the
directories are read again at each heartbeat.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from gq.messages import MAX_WARM_KEYS

log = logging.getLogger("gq.node")


class WarmCache:
    def __init__(self, per_gpu: int, dirs: Iterable[str] = (),
                 vram: Mapping[int, int] | None = None) -> None:
        self.per_gpu = max(0, min(per_gpu, MAX_WARM_KEYS))
        self.dirs = list(dirs)
        #: GPU index -> its memory in bytes (the daemon sets it from its GPUs; a GPU not in it
        #: is bounded by the cap alone).
        self.vram: dict[int, int] = dict(vram or {})
        #: GPU index -> its recent keys, least recent first, each with the bytes its job asked
        #: for (0: not given).
        self.recent: dict[int, OrderedDict[str, int]] = {}

    def launch(self, gpus: Iterable[int], key: str | None, gpu_mem: int | None = None
               ) -> bool | None:
        """A run of `key` (asking `gpu_mem` bytes per GPU, None: not said) starts on `gpus`:
        whether the key was warm on all of them before (None without a key), and it is the
        most recent key on each from now on."""
        if key is None:
            return None
        gpus = list(gpus)
        shared = self.from_dirs()
        warm = key in shared or all(key in self.recent.get(g, ()) for g in gpus)
        for gpu in gpus:
            lru = self.recent.setdefault(gpu, OrderedDict())
            lru[key] = gpu_mem or 0
            lru.move_to_end(key)
            self._evict(lru, self.vram.get(gpu))
        return warm

    def _evict(self, lru: OrderedDict[str, int], vram: int | None) -> None:
        """Drop the least recent keys beyond the cap, or while they do not all fit in the GPU's
        memory (the newest, just launched, always stays: it is loaded now)."""
        while len(lru) > self.per_gpu or (vram and len(lru) > 1 and sum(lru.values()) > vram):
            lru.popitem(last=False)

    def from_dirs(self) -> list[str]:
        """The keys the cache directories hold (their subdirectories' names), sorted."""
        found: set[str] = set()
        for path in self.dirs:
            try:
                with os.scandir(path) as entries:
                    found.update(e.name for e in entries if e.is_dir() and not
                                 e.name.startswith("."))
            except OSError as exc:
                log.warning("[node] cache_dirs %s: %s", path, exc)
        return sorted(found)[:MAX_WARM_KEYS]

    def report(self, gpus: Iterable[int]) -> dict[str, list[str]]:
        """GPU index (as text) -> its warm keys, for the heartbeat (GPUs with none left out)."""
        shared = self.from_dirs()
        out = {}
        for gpu in gpus:
            keys = [*reversed(self.recent.get(gpu, {})), *shared]
            if keys:
                out[str(gpu)] = list(dict.fromkeys(keys))[:MAX_WARM_KEYS]
        return out
