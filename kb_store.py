"""Chunk vectors in files that the index's own commit protects: immutable segments, keyed by content hash.

Each write adds one segment file (`vectors/seg-*.npz`, written atomically) *before* state.json names it, so a reader
that follows state.json only ever loads complete segments, and a crash leaves at most an unnamed file that the next
writer sweeps. No process holds a database open, so any number of processes read at once and a killed one corrupts
nothing. Search is an exact cosine (a product per segment; a search's several query vectors in onnxruntime's MatMul
where it is installed, kb_kernels.matmul_session).

A row is the models' vectors side by side (kb_vectors.MultiEmbedder's layout). It may hold only some of them (a first
index embeds the multilingual model first; an English-only model skips mostly Chinese text): its `parts` mask says
which, the slots of the others are zeros, and a query is scored only on rows holding the models it asks about. A row
that gains a model is written again whole; the later copy wins. A row's revisions (pack_revisions: a few bits a
model) say which kernel of its model made each vector (0 the float pass; the bundled models' int8 kernels 1 and up:
kb_minilm, kb_use); a vector of another revision than the embedder's counts as missing, so it is embedded again
and, until then, still answers. Imports: kb_config, kb_files, kb_kernels.
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

from kb_config import IndexFormatError
from kb_files import atomic_write_with
from kb_kernels import matmul_session

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
# A row's parts mask when it holds every model's vector; segments written before masks existed hold only such rows.
ALL_PARTS = 0xFF
# Models one row can hold (bits of the uint8 mask).
MAX_PARTS = 8
MASK_DTYPE = np.uint8
# A row's revisions: model i's in bits [i * REVISION_BITS, (i + 1) * REVISION_BITS) (pack_revisions), so each model's
# vectors can move to a newer kernel once more (0 the float pass; the int8 kernels 1, MiniLM's unfused norms 2).
REVISION_BITS = 2
REVS_DTYPE = np.uint16
REVS_ALL = 0xFFFF
# A scan of at least this many rows runs its second half on a second thread (numpy releases the GIL in the product;
# each thread one BLAS thread): tldr's 15,735 rows x 10 query vectors 11.1 ms -> 5.3-6.4 ms on two cores. Smaller
# scans (~1 ms) stay on one.
SPLIT_SCAN_ROWS = 4096
_SCAN_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vector-scan")


def part_slices(dims: Sequence[int]) -> list[slice]:
    """Where each model's vector sits in a row of models of these sizes, in order."""
    starts = np.cumsum([0, *dims]).tolist()
    return [slice(a, b) for a, b in zip(starts, starts[1:])]


def _bit_count(mask: int) -> int:
    return bin(mask).count("1")


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
        self._cache: dict[str, _Segment] = {}  # segment name -> its contents
        self._masks = np.zeros(0, dtype=MASK_DTYPE)  # each row's parts (ALL_PARTS: every model's vector)
        self._revs = np.zeros(0, dtype=REVS_DTYPE)  # each row's models' revisions (pack_revisions)
        self._dims: tuple[int, ...] | None = None  # the models' vector sizes, from the segments that record them
        self._partial = False  # some row that counts (the last of its content) lacks a model's vector
        self._factors: dict[int, np.ndarray] = {}  # parts a query asks about -> score factor per mask (see _factor)
        self._superseded: np.ndarray | None = None  # True for rows a later copy of the same text replaced

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

    @property
    def partial(self) -> bool:
        """Whether some content's row lacks a model's vector (a first index under way, or skipped text)."""
        return self._partial

    def missing(self, contents: Iterable[str], part: int | None = None, revs: int | None = None) -> list[str]:
        """The content hashes that have no vector yet (with `part`: none of model `part`, the index of its slots),
        in the order given, without repeats; with `revs` (pack_revisions), also those whose vector is of another
        revision than it says (model `part`'s; whole rows: every model's)."""
        with self._lock:
            row, masks, held = self._row, self._masks, self._revs
            if part is None:
                if revs is None:
                    return [c for c in dict.fromkeys(contents) if c not in row]
                return [c for c in dict.fromkeys(contents) if (i := row.get(c)) is None or held[i] != revs]
            bit, field = 1 << part, revision_field(part)
            if revs is None:
                return [c for c in dict.fromkeys(contents) if (i := row.get(c)) is None or not masks[i] & bit]
            want = revs & field
            return [
                c for c in dict.fromkeys(contents) if (i := row.get(c)) is None or not masks[i] & bit or held[i] & field != want
            ]

    def parts_of(self, content: str) -> int:
        """The parts mask of a content's row (0: no row; ALL_PARTS: every model's vector)."""
        with self._lock:
            i = self._row.get(content)
            return 0 if i is None else int(self._masks[i])

    def load(self, names: Sequence[str]) -> None:
        """Adopt the segments state.json names (loading only new ones). Raises FileNotFoundError if one is gone
        (another process compacted after we read state.json: re-read it and call again) or IndexFormatError."""
        names = tuple(names)
        with self._lock:
            if names == self._segments:
                return
            loaded = {n: self._cache.get(n) or self._read(n) for n in names}
            sizes = {seg.vectors.shape[1] for seg in loaded.values() if len(seg.vectors)}
            layouts = {seg.dims for seg in loaded.values() if seg.dims is not None}
            if len(sizes) > 1 or len(layouts) > 1 or any(sum(d) not in sizes for d in layouts if sizes):
                raise IndexFormatError(
                    f"vector segments in {self.folder} have different sizes {sorted(sizes)} (models {sorted(layouts)}); "
                    "run `python ingest.py --rebuild` to re-embed"
                )
            keys: list[str] = []
            blocks: list[np.ndarray] = []
            starts: list[int] = []
            for n in names:
                seg = loaded[n]
                if len(seg.keys):
                    starts.append(len(keys))
                    blocks.append(seg.vectors)
                keys.extend(seg.keys)
            masks = np.concatenate([loaded[n].masks for n in names]) if names else np.zeros(0, dtype=MASK_DTYPE)
            revs = np.concatenate([loaded[n].revs for n in names]) if names else np.zeros(0, dtype=REVS_DTYPE)
            row: dict[str, int] = {}
            for i, k in enumerate(keys):
                row[k] = i  # a later segment's copy of the same text wins: the same vectors, or more models'
            self._blocks, self._starts = blocks, np.asarray(starts, dtype=np.int64)
            self._keys, self._row, self._segments, self._cache = keys, row, names, loaded
            self._masks, self._revs = masks, revs
            self._dims = next(iter(layouts)) if layouts else None
            counted = np.fromiter(row.values(), dtype=np.int64, count=len(row))
            self._partial = bool((masks[counted] != ALL_PARTS).any())
            self._superseded = None
            if len(row) < len(keys):  # an earlier copy of a text may lack a model its last copy holds: never scored
                self._superseded = np.ones(len(keys), dtype=bool)
                self._superseded[counted] = False

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

    def _read(self, name: str) -> _Segment:
        path = self.folder / name
        try:
            with np.load(path, allow_pickle=False) as data:
                keys = [str(k) for k in data["keys"]]
                vectors = np.asarray(data["vectors"], dtype=DTYPE)
                masks = np.asarray(data["parts"], dtype=MASK_DTYPE) if "parts" in data else None
                dims = tuple(int(d) for d in data["dims"]) if "dims" in data else None
                revs = None
                if "revisions" in data:
                    revs = np.asarray(data["revisions"], dtype=REVS_DTYPE)
                elif "revs" in data:  # a bit a model, set for revision 1 (before REVISION_BITS)
                    bits = np.asarray(data["revs"], dtype=REVS_DTYPE)
                    revs = sum(((bits >> i) & 1) << (REVISION_BITS * i) for i in range(MAX_PARTS)).astype(REVS_DTYPE)
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError) as e:
            raise IndexFormatError(
                f"vector segment {path} is unreadable ({type(e).__name__}: {e}); run `python ingest.py --rebuild`"
            ) from e
        if masks is None:
            masks = np.full(len(keys), ALL_PARTS, dtype=MASK_DTYPE)
        if revs is None:  # written before revisions, or every vector from revision 0
            revs = np.zeros(len(keys), dtype=REVS_DTYPE)
        if vectors.ndim != 2 or len(keys) != len(vectors) or len(masks) != len(keys) or len(revs) != len(keys):
            raise IndexFormatError(f"vector segment {path} is malformed; run `python ingest.py --rebuild`")
        if dims is not None and len(vectors) and sum(dims) != vectors.shape[1]:
            raise IndexFormatError(
                f"vector segment {path} names models of sizes {dims} but holds rows of "
                f"{vectors.shape[1]}; run `python ingest.py --rebuild`"
            )
        return _Segment(keys, vectors, masks, dims, revs)

    # ---- writing (the caller holds the index lock, then commits state.json with the returned list) -------------

    def write_segment(self, vectors: dict[str, Sequence[float]], revs: int = 0) -> tuple[str, ...]:
        """Write the vectors (content hash -> vector, every model's, of the revisions `revs` says) not yet stored as
        such as one new segment file.

        Returns the segment list for state.json: the current one plus the new file (unchanged if nothing was new).
        The store keeps showing the old list until `load` is called with the new one after the commit.
        """
        with self._lock:
            row, masks, held = self._row, self._masks, self._revs
            new = {k: v for k, v in vectors.items() if (i := row.get(k)) is None or masks[i] != ALL_PARTS or held[i] != revs}
            if not new:
                return self._segments
            matrix = np.asarray(list(new.values()), dtype=DTYPE)
            full = np.full(len(new), ALL_PARTS, dtype=MASK_DTYPE)
            name = self._write(list(new), matrix, full, self._dims, np.full(len(new), revs, dtype=REVS_DTYPE))
            return (*self._segments, name)

    def write_part(self, part: int, dims: Sequence[int], vectors: dict[str, Sequence[float]], revs: int = 0) -> tuple[str, ...]:
        """Write model `part`'s vectors (content hash -> its slots' values, scaled as the row holds them; of the
        revision `revs` says for it) into rows of models of sizes `dims`: a content's row keeps what it held
        and gains this model's vector, or replaces one of another revision; contents that hold it already are left
        out. Returns the segment list for state.json, as write_segment does.

        Example: store.write_part(1, (512, 384), {"3fa2...": minilm_vector / math.sqrt(2)})
        """
        dims = tuple(int(d) for d in dims)
        if not 0 <= part < len(dims) <= MAX_PARTS:
            raise ValueError(f"model {part} of {len(dims)}: a row holds at most {MAX_PARTS} models")
        bit, full, where = 1 << part, (1 << len(dims)) - 1, part_slices(dims)[part]
        field = revision_field(part)
        with self._lock:
            if self._keys and self.dim != sum(dims):
                raise IndexFormatError(
                    f"the index's vectors have {self.dim} dimensions, the models {sum(dims)} ({dims}): they come from "
                    "other models; run `python ingest.py` to re-embed with the configured ones"
                )
            todo = [(k, self._row.get(k)) for k in vectors]
            want = revs & field
            todo = [(k, i) for k, i in todo if i is None or not self._masks[i] & bit or self._revs[i] & field != want]
            if not todo:
                return self._segments
            old = [i for _, i in todo if i is not None]
            matrix = np.zeros((len(todo), sum(dims)), dtype=DTYPE)
            masks = np.zeros(len(todo), dtype=MASK_DTYPE)
            row_revs = np.zeros(len(todo), dtype=REVS_DTYPE)
            if old:
                had = [j for j, (_, i) in enumerate(todo) if i is not None]
                matrix[had] = self._rows(old)
                masks[had] = self._masks[old]
                row_revs[had] = self._revs[old]
            matrix[:, where] = np.asarray([vectors[k] for k, _ in todo], dtype=DTYPE)
            masks |= bit
            masks[masks & full == full] = ALL_PARTS
            row_revs = (row_revs & REVS_DTYPE(~field & REVS_ALL)) | REVS_DTYPE(want)
            name = self._write([k for k, _ in todo], matrix, masks, dims, row_revs)
            return (*self._segments, name)

    def without_part(self, part: int, dims: Sequence[int], contents: Iterable[str]) -> tuple[str, ...]:
        """Write the rows of `contents` again without model `part`'s vector (its slots zeroed), for a model that no
        longer embeds them; a row left with no model is left as it was. Returns the segment list for state.json."""
        dims = tuple(int(d) for d in dims)
        bit, full, where = 1 << part, (1 << len(dims)) - 1, part_slices(dims)[part]
        with self._lock:
            if not self._keys or self.dim != sum(dims):
                return self._segments
            todo = []
            for k in dict.fromkeys(contents):
                i = self._row.get(k)
                mask = None if i is None else (full if self._masks[i] == ALL_PARTS else int(self._masks[i]))
                if mask is not None and mask & bit and mask & ~bit & full:
                    todo.append((k, i, mask & ~bit))
            if not todo:
                return self._segments
            matrix = self._rows([i for _, i, _ in todo])
            matrix[:, where] = 0.0
            masks = np.asarray([m for _, _, m in todo], dtype=MASK_DTYPE)
            row_revs = self._revs[[i for _, i, _ in todo]] & REVS_DTYPE(~revision_field(part) & REVS_ALL)
            name = self._write([k for k, _, _ in todo], matrix, masks, dims, row_revs)
            return (*self._segments, name)

    def _write(
        self, keys: list[str], matrix: np.ndarray, masks: np.ndarray, dims: tuple[int, ...] | None, revs: np.ndarray
    ) -> str:
        """One new segment file; masks and sizes are recorded only when a row lacks a model, revisions only when
        one is not 0 (else the file is the format every earlier version reads)."""
        name = f"seg-{uuid.uuid4().hex[:16]}{SEGMENT_SUFFIX}"
        extra = {} if dims is None or bool((masks == ALL_PARTS).all()) else {"parts": masks, "dims": np.asarray(dims)}
        if revs.any():
            extra["revisions"] = revs
        arrays = {"keys": np.asarray(keys, dtype=str), "vectors": matrix, **extra}
        # Streamed into the file (numpy writes an array in 16 MB pieces): a whole copy of the file first held the
        # matrix twice, on top of the old segments a compaction replaces (tldr's 56 MB: the end of an ingest's peak).
        atomic_write_with(self.folder / name, lambda f: np.savez(f, **arrays))
        self._cache[name] = _Segment(keys, matrix, masks, dims if "dims" in extra else None, revs)
        return name

    def compacted(self, live: set[str]) -> tuple[str, ...] | None:
        """A one-segment list holding only `live` contents, when the store is fragmented or mostly dead; else None."""
        with self._lock:
            dead = len(self._row) - len(live & self._row.keys()) + (len(self._keys) - len(self._row))
            fragmented = len(self._segments) > MAX_SEGMENTS
            if not fragmented and not (dead >= COMPACT_MIN_DEAD and dead > COMPACT_DEAD_SHARE * len(self._keys)):
                return None
            keep = [k for k in self._row if k in live]
            rows = [self._row[k] for k in keep]
            matrix = self._rows(rows) if keep else np.zeros((0, max(self.dim, 1)), dtype=DTYPE)
            return (self._write(keep, matrix, self._masks[rows], self._dims, self._revs[rows]),) if keep else ()

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

    def _factor(self, q: np.ndarray) -> np.ndarray | None:
        """Per row, what a query's dot product is multiplied by: 1 where the row holds every model the query has
        values for, 0 where it holds none (left out), and for a query of several models (a stored vector used as
        one) the models' count over those the row holds, so it is the mean over them. None: every row holds all."""
        if not self._partial or self._dims is None:
            return None
        asked = sum(1 << p for p, where in enumerate(part_slices(self._dims)) if q[where].any())
        lut = self._factors.get(asked)
        if lut is None:
            n = _bit_count(asked)
            held = [_bit_count((m if m != ALL_PARTS else asked) & asked) for m in range(ALL_PARTS + 1)]
            lut = self._factors[asked] = np.asarray([n / h if h else 0.0 for h in held], dtype=DTYPE)
        return lut[self._masks]

    def cosines(self, query: Sequence[float], contents: Sequence[str]) -> dict[str, float]:
        """Cosine of the (unit) query with each stored content hash given (absent ones, and those whose row lacks
        the query's model, are left out)."""
        with self._lock:
            rows = [(c, self._row[c]) for c in contents if c in self._row]
            if not rows:
                return {}
            q = self._query(query)
            sims = self._rows([i for _, i in rows]) @ q
            factor = self._factor(q)
            if factor is not None:
                scale = factor[[i for _, i in rows]]
                sims *= scale
                rows = [r for r, f in zip(rows, scale) if f]
                sims = sims[scale != 0]
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
            sims_all = _scan(self._blocks, q)
            keys = self._keys
            # Rows a query does not score: another copy of the same text (a later one counts), or without its model.
            factors = [self._factor(q[:, j]) for j in range(len(queries))]
            superseded = self._superseded
        out: list[list[tuple[str, float]]] = []
        for j, n in enumerate(ns):
            sims = sims_all[:, j]
            if factors[j] is not None or superseded is not None:
                sims = sims * factors[j] if factors[j] is not None else sims.copy()
                if factors[j] is not None:
                    sims[factors[j] == 0] = -np.inf
                if superseded is not None:
                    sims[superseded] = -np.inf
                n = min(n, int(np.isfinite(sims).sum()))
            k = min(n, len(sims))
            if k <= 0:
                out.append([])
                continue
            top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
            top = top[np.argsort(-sims[top], kind="stable")]
            out.append(list(zip([keys[i] for i in top.tolist()], sims[top].tolist())))  # tolist: C floats to Python's
        return out


def _product(block: np.ndarray, q: np.ndarray) -> np.ndarray:
    """block @ q: several columns in onnxruntime where it is installed (kb_kernels.matmul_session), one in numpy."""
    session = matmul_session() if q.shape[1] > 1 else None
    if session is None:
        return block @ q
    return session.run(["y"], {"a": block, "b": q})[0]


def revision_field(part: int) -> int:
    """The bits of a revisions mask that hold model `part`'s revision."""
    return ((1 << REVISION_BITS) - 1) << (REVISION_BITS * part)


def pack_revisions(revisions: Sequence[int]) -> int:
    """A revisions mask from each model's revision, in the models' order. Example: pack_revisions([1, 2]) == 0b1001."""
    if any(not 0 <= r < 1 << REVISION_BITS for r in revisions) or len(revisions) > MAX_PARTS:
        raise ValueError(f"revisions {list(revisions)}: at most {MAX_PARTS} models, each below {1 << REVISION_BITS}")
    return sum(r << (REVISION_BITS * i) for i, r in enumerate(revisions))


def _scan(blocks: Sequence[np.ndarray], q: np.ndarray) -> np.ndarray:
    """Every row's dot products with the query columns `q`, the blocks' rows in order; a large scan in two halves
    side by side (SPLIT_SCAN_ROWS)."""
    total = sum(len(b) for b in blocks)
    if total < SPLIT_SCAN_ROWS:
        parts = [_product(b, q) for b in blocks]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
    pieces: list[np.ndarray] = []  # the rows in order, split at the middle row
    start = 0
    for b in blocks:
        cut = total // 2 - start
        pieces.extend([b[:cut], b[cut:]] if 0 < cut < len(b) else [b])
        start += len(b)
    first = sum(1 for _ in itertools.takewhile(lambda n: n <= total // 2, itertools.accumulate(len(p) for p in pieces)))
    later = _SCAN_POOL.submit(lambda: [_product(p, q) for p in pieces[first:]])
    parts = [_product(p, q) for p in pieces[:first]]
    return np.concatenate(parts + later.result())


class _Segment(NamedTuple):
    """One segment file as read or written: content hashes, their rows, each row's parts mask, the models' sizes
    (None when every row holds every model) and each row's revisions mask."""

    keys: list[str]
    vectors: np.ndarray
    masks: np.ndarray
    dims: tuple[int, ...] | None
    revs: np.ndarray
