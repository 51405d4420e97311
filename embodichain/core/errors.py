"""Error types with their exit codes (design §9): 2 for bad input or a refusal, 1 for a failure."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


class EmbodichainError(Exception):
    """Base class: a message meant for the user, printed as one paragraph without a traceback."""

    exit_code = 1


class UsageError(EmbodichainError):
    """Bad usage, bad recipe, refused output directory or refused resume (exit 2)."""

    exit_code = 2


class ConfigError(UsageError):
    """A recipe that does not validate; carries every problem found."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = f"invalid recipe {where}{self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            text = f"invalid recipe {where}{len(self.problems)} problems:\n{lines}"
        super().__init__(text)


class DataFormatError(UsageError):
    """Training data that cannot be used as it is on disk, found when it is opened (at
    start-up, in the factory): a missing or malformed file, a table that disagrees with its
    metadata, a video shorter than its table (exit 2: the same data is refused again, so a
    restart is no use). Readers derive their format errors from it."""


class RefusedError(UsageError):
    """A command refused before doing anything (used output dir, incompatible resume...)."""


class CheckpointError(UsageError):
    """A checkpoint that cannot be used: corrupt, unsafe, or of an unknown format."""


class CheckpointCorruptError(CheckpointError):
    """The file is truncated, damaged or does not match its own digest."""


class UnsafeCheckpointError(CheckpointError):
    """The file would need arbitrary unpickling (code execution) to load."""


class TrainingError(EmbodichainError):
    """A failure during training, e.g. a save that failed on rank 0 (exit 1)."""


class DataFailure(TrainingError):
    """Loading training data failed: an example raised, or a data worker died (exit 1).

    Raised by the data layer with what failed; the trainer completes the message with the
    snapshot the run can continue from.
    """


class Stopped(EmbodichainError):
    """The run stopped on SIGINT / SIGTERM after saving a snapshot (exit 130 / 143).

    Every rank raises it at the same update; only rank 0 prints its message.
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# torch's words when `use_deterministic_algorithms(True)` meets an operation without an ordered
# kernel: "<op> does not have a deterministic implementation, but you set ...".
_NO_DETERMINISTIC_KERNEL = re.compile(r"(\S+) does not have a deterministic implementation")


def refused_by_determinism(exc: BaseException, update: int) -> TrainingError | None:
    """The one-paragraph failure (exit 1) for torch refusing, at `update`, an operation that
    has no deterministic implementation because `trainer.deterministic` is true: which
    operation, why, and how to go on. None for any other error (ours are left as they are)."""
    if isinstance(exc, EmbodichainError):
        return None
    found = _NO_DETERMINISTIC_KERNEL.search(str(exc))
    if found is None:
        return None
    return TrainingError(
        f"update {update}: the operation {found.group(1)} has no deterministic implementation "
        "in torch, and trainer.deterministic: true makes torch refuse such operations. Set "
        "trainer.deterministic: false to train with it (`--set trainer.deterministic=false`, "
        "allowed on resume too; results then repeat only to float rounding), or replace the "
        "operation in the model.")


def refusal_in_chain(exc: BaseException) -> UsageError | None:
    """The refusal (UsageError) behind `exc`, an exception of another type: a factory that
    re-raises our error (or a reader's DataFormatError) wrapped in its own, `from exc` or
    not, still refuses with exit 2. Follows `__cause__`, then `__context__`, also where the
    context was suppressed (`from None` hides it from the traceback, not from the verdict).
    None when `exc` is ours itself (its own exit code stands) or no refusal caused it."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, EmbodichainError):
            return link if link is not exc and isinstance(link, UsageError) else None
        link = link.__cause__ if link.__cause__ is not None else link.__context__
    return None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`"did you mean 'X'? "` for the closest of `choices`, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'? " if close else ""


_PEER_LOST = re.compile(r"Connection (?:closed|reset) by peer(?: \[[^\]]*\]:\d+)?")


def peer_lost(exc: BaseException) -> str | None:
    """For a collective that failed because another rank is gone (gloo's "Connection closed
    by peer ... GLHF!"): what this rank says instead, pointing at the rank that failed
    first; None for any other error. Only the rank that failed first knows the cause, and
    torchrun's report names it as the root cause."""
    text = str(exc)
    found = _PEER_LOST.search(text)
    if found is None or "gloo" not in text:
        return None
    return ("this rank lost another rank in a collective (gloo: "
            f"{found.group(0).strip()}): another rank failed or was killed first; its own "
            "error is the cause (torchrun's report names it as the root cause)")
