"""`trainer.profile` (R-OPS-2): which updates torch.profiler records; its use lives in
core/observe/profiling.py."""

from __future__ import annotations

from pydantic import PositiveInt

from embodichain.core.recipe.schema_base import Section


class ProfileConfig(Section):
    """torch.profiler over updates `start` to `start + updates - 1`, on every rank."""

    start: PositiveInt
    """The first profiled update (1 is the run's first update)."""
    updates: PositiveInt = 3
    """How many updates the profile covers."""

    @property
    def last(self) -> int:
        return self.start + self.updates - 1


def profile_problem(profile: ProfileConfig | None, max_updates: int | None) -> str | None:
    """Why the window does not fit the run (it must end by `trainer.max_updates`)."""
    if profile is None or not max_updates or profile.last <= max_updates:
        return None
    return (f"updates {profile.start}..{profile.last} run past trainer.max_updates "
            f"({max_updates})")
