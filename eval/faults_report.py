"""What every part of eval/faults.py returns: its figures and the inconsistencies it found, each with a repro.

Standard library only.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Finding:
    """One inconsistency: which case, what should have happened, what did, and how to see it again."""

    case: str
    expected: str
    got: str
    repro: str = ""
    count: int = 1  # inconsistencies this finding stands for (one finding may sum up many alike)


@dataclass
class PartResult:
    """A part's figures (counts, latencies) and its findings; `inconsistencies` is what the test asserts is 0."""

    name: str
    figures: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def inconsistencies(self) -> int:
        return sum(f.count for f in self.findings)

    def fail(self, case: str, expected: str, got: str, repro: str = "") -> None:
        self.findings.append(Finding(case, expected, got[:2000], repro))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inconsistencies": self.inconsistencies,
            "seconds": round(self.seconds, 1),
            "figures": self.figures,
            "findings": [asdict(f) for f in self.findings],
        }


@dataclass
class Run:
    """Settings and shared state of one faults run: where it works, which model, the random source, the processes."""

    root: Path
    model: str | None  # embedding.model written to each config; None: the configured default (--real-model)
    quick: bool
    seed: int
    procs: Any  # faults_common.Processes
    verbose: bool = True
    rng: random.Random = field(init=False)
    t0: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def say(self, msg: str) -> None:
        """Progress on stderr (stdout carries only the figures)."""
        if self.verbose:
            print(f"[faults {time.perf_counter() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def folder(self, name: str) -> Path:
        p = self.root / name
        p.mkdir(parents=True, exist_ok=True)
        return p
