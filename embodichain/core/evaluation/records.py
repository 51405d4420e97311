"""An evaluation's outcome on rank 0: per-episode records, films, and the metrics (R-EVAL-1).

Records are ordered by episode index and hold nothing of the rank that ran them, so they
are the same on any world size. Under the run directory an evaluation at update U writes
`evaluations/update_UUUUUU.jsonl` (one record per line: episode, seed, success, return,
length, how it ended, the failure reason; a filmed episode's film, or why it has none,
`video_missing`) and the films of the first episodes as
`evaluations/update_UUUUUU/episode_EEEE.mp4`; one cut short by a stop (R-EVAL-4), only the
episodes it finished, as `evaluations/update_UUUUUU.interrupted.jsonl`. `embodichain eval
--out DIR` writes `DIR/episodes.jsonl`, `DIR/summary.json` and `DIR/videos/`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodichain.core.evaluation.episodes import Outcome
from embodichain.core.evaluation.intervals import successes_of, wilson_interval

EVALUATIONS = "evaluations"
INTERRUPTED = ".interrupted.jsonl"  # the episodes an evaluation cut short by a stop finished
PREFIX = "validation"


def evaluation_name(step: int) -> str:
    """The name of the evaluation at update `step` under RUN_DIR/evaluations."""
    return f"update_{step:06d}"


def film_name(episode: int) -> str:
    return f"episode_{episode:04d}.mp4"


@dataclass
class EvaluationResult:
    """Every episode's record (by index) and the films, as rank 0 gathered them."""

    records: list[dict[str, Any]]
    films: dict[int, bytes] = field(default_factory=dict, repr=False)
    fps: int = 30
    wall_s: float = 0.0
    seed_role: str = "validation"
    """`test` (seeds no validation touched) or `validation` (those that select best.pt:
    what a validation inside training judges), as `eval` sets it (R-TRUST-2)."""

    @classmethod
    def merge(cls, per_rank: Iterable[Sequence[Outcome]], fps: int, wall_s: float
              ) -> EvaluationResult:
        outcomes = sorted((o for rank in per_rank for o in rank),
                          key=lambda o: o.record["episode"])
        return cls([o.record for o in outcomes],
                   {o.record["episode"]: o.film for o in outcomes if o.film}, fps, wall_s)

    def metrics(self, prefix: str = PREFIX) -> dict[str, float]:
        """`{prefix}/success_rate`, `/return`, `/episode_length` (means over the episodes),
        `/episode_failures` (episodes ended by a fault), and `/<name>_rate` for each outcome
        an `EpisodeJudge` gave (the share of episodes where it holds)."""
        n = max(1, len(self.records))
        metrics = {f"{prefix}/success_rate": sum(bool(r["success"]) for r in self.records) / n,
                   f"{prefix}/return": sum(float(r["return"]) for r in self.records) / n,
                   f"{prefix}/episode_length": sum(int(r["length"]) for r in self.records) / n,
                   f"{prefix}/episode_failures": float(sum(r["failure"] is not None
                                                           for r in self.records))}
        names = sorted({k for r in self.records for k in r.get("outcomes") or {}})
        for name in names:
            metrics[f"{prefix}/{name}_rate"] = sum(
                bool((r.get("outcomes") or {}).get(name)) for r in self.records) / n
        return metrics

    def intervals(self, prefix: str = PREFIX) -> dict[str, tuple[float, float]]:
        """The Wilson 95% interval (R-TRUST-3) of every `_rate` metric of `metrics`, from
        its count of episodes out of all of them."""
        n = len(self.records)
        return {key: wilson_interval(successes_of(value, n), n)
                for key, value in self.metrics(prefix).items() if key.endswith("_rate")}

    def write(self, records_file: Path, films_dir: Path, relative_to: Path
              ) -> dict[int, Path]:
        """Write the films into `films_dir` and the records (each filmed one naming its
        film, relative to `relative_to`) into `records_file`; the films' paths by episode."""
        written: dict[int, Path] = {}
        for episode, data in sorted(self.films.items()):
            path = films_dir / film_name(episode)
            _write_atomically(path, data)
            written[episode] = path
        lines = []
        for record in self.records:
            if record["episode"] in written:
                record = {**record, "video": str(written[record["episode"]].relative_to(
                    relative_to))}
            lines.append(json.dumps(record, allow_nan=False) + "\n")
        _write_atomically(records_file, "".join(lines).encode())
        return written


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of an evaluation's JSONL file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def summary(result: EvaluationResult, about: Mapping[str, Any]) -> dict[str, Any]:
    """`embodichain eval`'s summary.json: what was evaluated, on which seeds (`seeds`,
    `seed_role`), the metrics, and each success rate's Wilson 95% interval (`intervals`:
    `{metric: [low, high]}`)."""
    seeds = [int(r["seed"]) for r in result.records]
    return {**about, "episodes": len(result.records),
            "seeds": f"{min(seeds)}..{max(seeds)}" if seeds else "",
            "seed_role": result.seed_role,
            "metrics": result.metrics(),
            "intervals": {k: [round(lo, 4), round(hi, 4)]
                          for k, (lo, hi) in result.intervals().items()},
            "wall_s": round(result.wall_s, 3)}
