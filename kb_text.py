"""Text as the index reads it: BM25 tokenizing (jieba for Chinese, with the vault's own terms), language (how Chinese
a text is), line splitting, token estimates and content hashes.

Pure: strings in, tokens and numbers out; touches no files except jieba's dictionary cache. Imports: kb_files (the
word table jieba's dictionary is shared through).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from kb_files import WordCounts, drop_older_caches

logger = logging.getLogger(__name__)

# Bump when tokenizing changes in a way that invalidates stored BM25 postings.
TOKENIZER_VERSION = 4

# A vault term (title, alias, tag) joins the jieba dictionary only within these lengths.
USER_TERM_MIN_CHARS, USER_TERM_MAX_CHARS = 2, 12

# jieba frequency given to vault terms: fixed (not suggested) so every process segments alike, and high
# enough that a term beats the split into its common parts.
USER_TERM_FREQ = 2000

# Longest token kept: a longer run of letters/digits (a hash, a base64 blob) is cut to this prefix, so one
# hostile run costs bounded index space; 64 keeps a SHA-256 in hex whole.
MAX_TOKEN_CHARS = 64

# jieba's prefix dictionary (500k entries) is opened once per process, by its first Tokenizer (mapped from the word
# table, ~1 ms, else read by jieba from its own cache, ~1.2 s), and shared read-only by every Tokenizer of the process
# (a rebuilt engine, a test suite's hundreds), each with its own vault terms on top (WordCounts).
_DICTIONARY_LOCK = threading.Lock()  # held while a dictionary is opened or given vault terms
_DICTIONARIES: dict[object, tuple[Mapping[str, int], int]] = {}  # jieba dictionary (None: the default) -> (table, total)

CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"

_CJK_RE = re.compile(f"[{CJK_CHARS}]")

_CJK_RUN_RE = re.compile(f"[{CJK_CHARS}]+")

_MIXED_PART_RE = re.compile(f"[{CJK_CHARS}]+|[a-z0-9]+")

# Runs of letters, digits and CJK: the unit handed to jieba (so "云仓wms" can match a user term).
_RUN_RE = re.compile(f"[{CJK_CHARS}a-z0-9]+(?:\\+\\+|#)?")

_LATIN_WORD_RE = re.compile(r"[a-z0-9]+(?:\+\+|#)?")

# Identifiers such as backup-nightly.timer, settings.local.json, err_conn_reset: indexed whole as well.
# Linear time: it starts only at the start of a run and its runs are possessive, so a long run without a
# separator fails once instead of being retried from every position inside it (quadratic before).
_COMPOUND_RE = re.compile(r"(?<![a-z0-9])[a-z0-9]++(?:[._\-/:][a-z0-9]++)+")

_SYMBOL_RE = re.compile(f"[^\\s{CJK_CHARS}A-Za-z0-9_]")

_WORD_RE = re.compile(r"[A-Za-z0-9_]+")

# Code in a note's text (fenced blocks, inline spans): not prose when judging its language.
_CODE_RE = re.compile(r"```.*?(?:```|$)|`[^`\n]*`", re.S)

# Latin words (letters only: numbers and identifiers' digits are no language).
_LATIN_LETTERS_RE = re.compile(r"[A-Za-z]+")

_PROSE_RE = re.compile(f"[{CJK_CHARS}A-Za-z]")

EN_STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below between
    both but by can could did do does doing down during each few for from further had has have having he her here
    hers herself him himself his how i if in into is it its itself just me more most my myself no nor not now of off
    on once only or other our ours ourselves out over own same she should so some such than that the their theirs
    them themselves then there these they this those through to too under until up very was we were what when where
    which while who whom why will with would you your yours yourself yourselves don doesn didn isn aren wasn weren
    haven hasn hadn won wouldn shouldn couldn ll ve re tell told show find know want please many much also again
    really just still ever even get got say said thing things""".split()
)

ZH_STOPWORDS = frozenset(
    """的 了 是 在 和 与 及 或 也 就 都 而 着 过 被 把 让 给 对 从 向 于 以 之 其 这 那 这个 那个 这些 那些 哪 哪个 哪些
    什么 怎么 怎样 怎么样 如何 为什么 为何 为啥 啥 咋 吗 呢 吧 啊 呀 哦 嗯 么 嘛 我 我们 你 你们 他 他们 她 她们 它 它们
    自己 有 没有 没 不 很 还 又 再 才 就是 一个 一下 一些 有没有 是不是 是否 可以 能 会 要 想 请问 请 关于 一 个 当时 之前
    以前 以后 之后 时候 什么时候 多少 多久 多长 多长时间 几 几个 几次 几天 几点 哪 哪天 哪里 哪儿 哪家 哪位 谁 那次 这次
    上次 那个 这个 那些 这些 那里 这里 还是 或者 然后 因为 所以 如果 但是 而且 已经 应该 需要 记得 里 中 上 下""".split()
)

STOPWORDS = EN_STOPWORDS | ZH_STOPWORDS


def split_lines(text: str) -> list[str]:
    """A note's lines as chunk line numbers count them: CRLF, CR-only (old Mac) and LF all end a line.

    Readers that cite line numbers (read_note, the append path) split with this too, so they agree with search.
    Example: split_lines("a\rb\r\nc") -> ["a", "b", "c"]
    """
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def estimate_tokens(text: str) -> int:
    """Approximate model tokens: one per CJK character, Latin word and symbol."""
    return len(_CJK_RE.findall(text)) + len(_WORD_RE.findall(text)) + len(_SYMBOL_RE.findall(text))


def content_hash(*parts: str) -> str:
    """Stable short hash of text parts (chunk ids, embedding reuse keys); never fails, even on lone surrogates."""
    h = hashlib.blake2b(digest_size=10)
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))  # a file name that is not UTF-8 arrives with surrogates
        h.update(b"\x00")
    return h.hexdigest()


class WordTable(Protocol):
    """A file cache of jieba's prefix dictionary (kb_files.WordTableFile): read(key) gives None unless written under key."""

    def read(self, key: str) -> tuple[Mapping[str, int], int] | None: ...

    def write(self, key: str, table: Mapping[str, int], total: int) -> None: ...


def _dictionary_key(tk: Any) -> str | None:
    """What jieba's default dictionary is (jieba's version, dict.txt's size and time), or None for another one."""
    if tk.dictionary is not None:
        return None
    import jieba

    try:
        st = (Path(jieba.__file__).parent / "dict.txt").stat()  # jieba's DEFAULT_DICT_NAME
    except OSError:
        return None
    return f"jieba-{getattr(jieba, '__version__', '?')}-{st.st_size}-{st.st_mtime_ns}"


class Tokenizer:
    """BM25 tokenizer for Chinese, English and mixed text; the same instance serves ingest and query.

    Chinese goes through jieba's cut_for_search with the vault's own terms (titles, aliases, tags) added to its
    dictionary; without jieba it falls back to CJK unigrams + bigrams. Latin text is lowercased words, and
    identifiers such as `backup-nightly.timer` are kept whole as well as split.
    """

    def __init__(self, use_jieba: bool = True, cache_dir: Path | None = None, word_table: WordTable | None = None) -> None:
        self._jieba = None
        self._word_table = word_table  # where the process's first tokenizer keeps jieba's dictionary (kb_files)
        self.user_terms: frozenset[str] = frozenset()
        self._pending_add: set[str] = set()  # dictionary changes not yet applied to jieba (see _sync_dictionary)
        self._pending_del: set[str] = set()
        if use_jieba:
            try:
                import jieba
            except ImportError:
                logger.warning("jieba is not installed; Chinese falls back to unigrams + bigrams (pip install jieba)")
            else:
                jieba.setLogLevel(logging.WARNING)  # its "Building prefix dict" lines must never reach stdout
                tk = jieba.Tokenizer()
                if cache_dir is not None:  # where jieba keeps its prefix dictionary (kb_config.Config.cache_dir)
                    try:
                        cache_dir.mkdir(parents=True, exist_ok=True)
                        tk.tmp_dir = str(cache_dir)
                    except OSError as e:
                        logger.info("jieba's cache stays in the temp folder: cannot use %s (%s)", cache_dir, e)
                self._jieba = tk
        self.signature = f"tok{TOKENIZER_VERSION}-{'jieba' if self._jieba else 'ngram'}-{content_hash(*sorted(STOPWORDS))}"

    @property
    def uses_jieba(self) -> bool:
        return self._jieba is not None

    def set_user_terms(self, terms: Iterable[str]) -> frozenset[str]:
        """Make the vault's own names single tokens; returns the terms whose treatment changed."""
        new = vault_terms(terms)
        changed = new ^ self.user_terms
        self._pending_add |= new - self.user_terms
        self._pending_add -= self.user_terms - new
        self._pending_del |= self.user_terms - new
        self.user_terms = new
        return changed

    def load_dictionary(self) -> None:
        """Read jieba's dictionary now (0.2-0.4 s, once per process), not in the first Chinese tokenize. Safe without the
        caller's lock: the read has its own, and the vault's terms are still added by the next tokenize."""
        if self._jieba is not None and not self._jieba.initialized:
            self._load_dictionary()

    def _sync_dictionary(self) -> None:
        """Apply dictionary changes lazily: loading jieba's dictionary costs ~1 s, and a no-change sync needs none."""
        tk = self._jieba
        if tk is None:
            return
        if not tk.initialized:
            self._load_dictionary()
        if not (self._pending_add or self._pending_del):
            return
        with _DICTIONARY_LOCK:
            for t in self._pending_del:
                if t not in self.user_terms:
                    tk.del_word(t)
            for t in self._pending_add:
                tk.add_word(t, freq=USER_TERM_FREQ)
            self._pending_add, self._pending_del = set(), set()

    def _load_dictionary(self) -> None:
        """jieba's prefix dictionary for this tokenizer: the process's shared one (mapped from the word table, else read
        by jieba the first time) under this tokenizer's own words."""
        tk = self._jieba
        with _DICTIONARY_LOCK:
            if tk.initialized:
                return
            shared = _DICTIONARIES.get(tk.dictionary)
            if shared is None:
                key = _dictionary_key(tk)
                shared = self._word_table.read(key) if self._word_table is not None and key else None
                if shared is None and self._word_table is not None and key:
                    # Built from dict.txt without jieba's own marshal cache (9 MB), which the word table replaces.
                    built = tk.gen_pfdict(tk.get_dict_file())
                    self._word_table.write(key, *built)
                    shared = self._word_table.read(key) or built  # mapped: shared with other processes
                if self._word_table is not None and key and tk.tmp_dir is not None:
                    drop_older_caches(Path(tk.tmp_dir), "jieba.cache")  # jieba's own, which an earlier version wrote
                if shared is None:
                    tk.initialize()
                    shared = tk.FREQ, tk.total
                _DICTIONARIES[tk.dictionary] = shared
            tk.FREQ, tk.total, tk.initialized = WordCounts(shared[0]), shared[1], True

    def _cjk_tokens(self, run: str) -> list[str]:
        if self._jieba is not None:
            self._sync_dictionary()
            out = []
            for t in self._jieba.cut_for_search(run, HMM=True):
                out.append(t)
                if t in self.user_terms and not _CJK_RUN_RE.fullmatch(t):
                    out.extend(_MIXED_PART_RE.findall(t))  # "云仓wms" also matches "云仓" and "wms"
            return out
        out: list[str] = []
        pos = 0
        for m in _CJK_RUN_RE.finditer(run):
            out.extend(_LATIN_WORD_RE.findall(run[pos : m.start()]))
            s = m.group(0)
            out.extend(s)
            out.extend(s[i : i + 2] for i in range(len(s) - 1))
            pos = m.end()
        out.extend(_LATIN_WORD_RE.findall(run[pos:]))
        return out

    def tokenize(self, text: str) -> list[str]:
        """Lowercased, normalized tokens with stopwords and punctuation removed."""
        norm = unicodedata.normalize("NFKC", text).lower()
        tokens = [m.group(0) for m in _COMPOUND_RE.finditer(norm)]
        for m in _RUN_RE.finditer(norm):
            run = m.group(0)
            if _CJK_RE.search(run):
                tokens.extend(self._cjk_tokens(run))
            else:
                tokens.append(run)
        return [t[:MAX_TOKEN_CHARS] for t in tokens if t not in STOPWORDS and (len(t) > 1 or t.isdigit() or _CJK_RE.match(t))]


def vault_terms(names: Iterable[str]) -> frozenset[str]:
    """Dictionary words from vault titles, aliases and tags: their runs of letters/digits/CJK that contain CJK.

    Example: vault_terms(["云仓WMS 项目", "Homelab"]) -> {"云仓wms", "项目"}
    """
    out = set()
    for name in names:
        for run in _RUN_RE.findall(unicodedata.normalize("NFKC", name).lower()):
            if USER_TERM_MIN_CHARS <= len(run) <= USER_TERM_MAX_CHARS and _CJK_RE.search(run):
                out.add(run)
    return frozenset(out)


def has_cjk(text: str) -> bool:
    """Whether `text` holds any Chinese (or Japanese) character."""
    return _CJK_RE.search(text) is not None


def cjk_share(text: str) -> float:
    """How Chinese (or Japanese) `text` reads: CJK characters among its words, where each CJK character and each Latin
    word counts once; code (fenced blocks, `spans`) is left out while prose remains.

    Counting characters instead made a Chinese note full of commands read as English (a code line outweighs its
    caption), and a short English word as long as several Chinese words.
    Example: cjk_share("git reset --hard 和 --soft 有什么区别") -> 0.6
    """
    if not has_cjk(text):  # most chunks of an English vault: no need to set code apart
        return 0.0
    prose = _CODE_RE.sub(" ", text)
    if not _PROSE_RE.search(prose):
        prose = text
    cjk = len(_CJK_RE.findall(prose))
    words = cjk + len(_LATIN_LETTERS_RE.findall(prose))
    return cjk / words if words else 0.0
