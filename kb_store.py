"""Chunk vectors in files that the index's own commit protects: immutable segments, keyed by content hash.

Each write adds one segment file (`vectors/seg-*.npz`, written atomically) *before* state.json names it, so a reader
that follows state.json only ever loads complete segments, and a crash leaves at most an unnamed file that the next
writer sweeps. No process holds a database open, so any number of processes read at once and a killed one corrupts
nothing. Search is an exact cosine (a matrix-vector product per segment). Imports: kb_config, kb_files.
"""

from __future__ import annotations

import io
import logging
import threading
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from kb_config import IndexFormatError
from kb_files import atomic_write_bytes

logger = logging.getLogger(__name__)

# Folder under the index folder that holds the segment files.
SEGMENT_DIR = "vectors"
SEGMENT_SUFFIX = ".npz"
# Compact into one segment once this many segments exist (each commit with new vectors adds one)...
MAX_SEGMENTS = 24
# ...or once rows no chunk references (edited or deleted text) exceed this share of all rows...
COMPACT_DEAD_SHARE = 0.3
# ...and this many, so a small index is not rewritten on every edit.
COMPACT_MIN_DEAD = 500
# Stored precision: float32 keeps cosines exact to ~1e-7 at half the memory of float64.
DTYPE = np.float32


class VectorStore:
    """The vectors of one index as this process sees them: the segments state.json names, each one block in memory.

    Writers call `write_segment` (under the index lock) and then commit state.json naming the new list of segments;
    readers call `load(segment_names)` with the list they read from state.json. Thread-safe.
    """

    def __init__(self, index_dir: Path) -> None:
        self.folder = index_dir / SEGMENT_DIR
        self._lock = threading.RLock()
        self._segments: tuple[str, ...] = ()
        self._keys: list[str] = []
        self._row: dict[str, int] = {}  # content -> its row, counted over the blocks in order
        # One block of vectors per segment, as read or written, never copied into one matrix: a commit adds a small
        # block, where concatenating made a second copy of every vector (+64 MB at tldr, the server's memory peak).
        self._blocks: list[np.ndarray] = []
        self._starts = np.zeros(0, dtype=np.int64)  # each block's first row
        self._cache: dict[str, tuple[list[str], np.ndarray]] = {}  # segment name -> (keys, vectors)

    # ---- what is loaded ---------------------------------------------------------------------------------------

    @property
    def segments(self) -> tuple[str, ...]:
        return self._segments

    @property
    def dim(self) -> int:
        return int(self._blocks[0].shape[1]) if self._blocks else 0

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, content: object) -> bool:
        return content in self._row

    def missing(self, contents: Iterable[str]) -> list[str]:
        """The content hashes that have no vector yet, in the order given, without repeats."""
        with self._lock:
            return [c for c in dict.fromkeys(contents) if c not in self._row]

    def load(self, names: Sequence[str]) -> None:
        """Adopt the segments state.json names (loading only new ones). Raises FileNotFoundError if one is gone
        (another process compacted after we read state.json: re-read it and call again) or IndexFormatError."""
        names = tuple(names)
        with self._lock:
            if names == self._segments:
                return
            loaded = {n: self._cache.get(n) or self._read(n) for n in names}
            dims = {v.shape[1] for _, v in loaded.values() if len(v)}
            if len(dims) > 1:
                raise IndexFormatError(
                    f"vector segments in {self.folder} have different sizes {sorted(dims)}; "
                    "run `python ingest.py --rebuild` to re-embed"
                )
            keys: list[str] = []
            blocks: list[np.ndarray] = []
            starts: list[int] = []
            for n in names:
                k, v = loaded[n]
                if len(k):
                    starts.append(len(keys))
                    blocks.append(v)
                keys.extend(k)
            row: dict[str, int] = {}
            for i, k in enumerate(keys):
                row[k] = i  # a later segment's copy of the same text wins; either vector is the same model's
            self._blocks, self._starts = blocks, np.asarray(starts, dtype=np.int64)
            self._keys, self._row, self._segments, self._cache = keys, row, names, loaded

    def _rows(self, rows: Sequence[int]) -> np.ndarray:
        """The vectors at these rows, in order, as one (len(rows), dim) array (a copy); the caller holds the lock."""
        if len(self._blocks) == 1:
            return self._blocks[0][list(rows)]
        wanted = np.asarray(rows, dtype=np.int64)
        at = np.searchsorted(self._starts, wanted, side="right") - 1
        out = np.empty((len(wanted), self.dim), dtype=DTYPE)
        for b in np.unique(at).tolist():
            mine = at == b
            out[mine] = self._blocks[b][wanted[mine] - self._starts[b]]
        return out

    def _read(self, name: str) -> tuple[list[str], np.ndarray]:
        path = self.folder / name
        try:
            with np.load(path, allow_pickle=False) as data:
                keys = [str(k) for k in data["keys"]]
                vectors = np.asarray(data["vectors"], dtype=DTYPE)
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError) as e:
            raise IndexFormatError(
                f"vector segment {path} is unreadable ({type(e).__name__}: {e}); run `python ingest.py --rebuild`"
            ) from e
        if vectors.ndim != 2 or len(keys) != len(vectors):
            raise IndexFormatError(f"vector segment {path} is malformed; run `python ingest.py --rebuild`")
        return keys, vectors

    # ---- writing (the caller holds the index lock, then commits state.json with the returned list) -------------

    def write_segment(self, vectors: dict[str, Sequence[float]]) -> tuple[str, ...]:
        """Write the vectors (content hash -> vector) not yet stored as one new segment file.

        Returns the segment list for state.json: the current one plus the new file (unchanged if nothing was new).
        The store keeps showing the old list until `load` is called with the new one after the commit.
        """
        with self._lock:
            new = {k: v for k, v in vectors.items() if k not in self._row}
            if not new:
                return self._segments
            name = self._write(list(new), np.asarray(list(new.values()), dtype=DTYPE))
            return (*self._segments, name)

    def _write(self, keys: list[str], matrix: np.ndarray) -> str:
        name = f"seg-{uuid.uuid4().hex[:16]}{SEGMENT_SUFFIX}"
        buf = io.BytesIO()
        np.savez(buf, keys=np.asarray(keys, dtype=str), vectors=matrix)
        atomic_write_bytes(self.folder / name, buf.getvalue())
        self._cache[name] = (keys, matrix)
        return name

    def compacted(self, live: set[str]) -> tuple[str, ...] | None:
        """A one-segment list holding only `live` contents, when the store is fragmented or mostly dead; else None."""
        with self._lock:
            dead = len(self._row) - len(live & self._row.keys()) + (len(self._keys) - len(self._row))
            fragmented = len(self._segments) > MAX_SEGMENTS
            if not fragmented and not (dead >= COMPACT_MIN_DEAD and dead > COMPACT_DEAD_SHARE * len(self._keys)):
                return None
            keep = [k for k in self._row if k in live]
            matrix = self._rows([self._row[k] for k in keep]) if keep else np.zeros((0, max(self.dim, 1)), dtype=DTYPE)
            return (self._write(keep, matrix),) if keep else ()

    def clear(self) -> None:
        """Forget every vector (rebuild, model change); the caller has committed a state.json naming none."""
        self.remove_unlisted(())
        self.load(())

    def remove_unlisted(self, listed: Iterable[str]) -> None:
        """Delete segment files no longer named by state.json (after a compaction or a model change is committed).

        A process still holding them in memory keeps working; one that reads the old state.json after this gets
        FileNotFoundError from `load`, re-reads state.json and finds the new list.
        """
        keep = set(listed)
        if not self.folder.is_dir():
            return
        for p in self.folder.glob(f"seg-*{SEGMENT_SUFFIX}"):
            if p.name not in keep:
                try:
                    p.unlink()
                except OSError as e:
                    logger.debug("could not remove old vector segment %s: %s", p, e)
        with self._lock:
            self._cache = {n: v for n, v in self._cache.items() if n in keep}

    # ---- reading -----------------------------------------------------------------------------------------------

    def vector(self, content: str) -> np.ndarray | None:
        with self._lock:
            i = self._row.get(content)
            if i is None:
                return None
            if len(self._blocks) == 1:  # an ingest's or a compaction's one segment: thousands of calls per warm-up
                return self._blocks[0][i]
            b = int(np.searchsorted(self._starts, i, side="right")) - 1
            return self._blocks[b][i - int(self._starts[b])]

    def _query(self, query: Sequence[float]) -> np.ndarray:
        q = np.asarray(query, dtype=DTYPE)
        if self._keys and q.shape != (self.dim,):
            raise IndexFormatError(
                f"the index's vectors have {self.dim} dimensions but the query has {q.size}: they come from another "
                "embedding model; run `python ingest.py` to re-embed with the configured one"
            )
        return q

    def cosines(self, query: Sequence[float], contents: Sequence[str]) -> dict[str, float]:
        """Cosine of the (unit) query with each stored content hash given (absent ones are left out)."""
        with self._lock:
            rows = [(c, self._row[c]) for c in contents if c in self._row]
            if not rows:
                return {}
            sims = self._rows([i for _, i in rows]) @ self._query(query)
        return {c: float(s) for (c, _), s in zip(rows, sims)}

    def nearest(self, query: Sequence[float], n: int) -> list[tuple[str, float]]:
        """The `n` stored contents nearest the (unit) query, as (content hash, cosine), best first.

        Includes contents no chunk references any more; callers skip those and ask for more.
        """
        return self.nearest_many([query], [n])[0]

    def nearest_many(self, queries: Sequence[Sequence[float]], ns: Sequence[int]) -> list[list[tuple[str, float]]]:
        """`nearest` for several queries (the j-th wants ns[j] contents) in one pass over the vectors: a search's
        query and alternatives, each model's; the pass is memory-bound, so k queries cost little more than one."""
        with self._lock:
            if not self._keys or not queries:
                return [[] for _ in queries]
            q = np.stack([self._query(v) for v in queries], axis=1)
            parts = [b @ q for b in self._blocks]
            sims_all = parts[0] if len(parts) == 1 else np.concatenate(parts)
            keys = self._keys
        out: list[list[tuple[str, float]]] = []
        for j, n in enumerate(ns):
            sims = sims_all[:, j]
            k = min(n, len(sims))
            if k <= 0:
                out.append([])
                continue
            top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
            top = top[np.argsort(-sims[top], kind="stable")]
            out.append([(keys[i], float(sims[i])) for i in top])
        return out
