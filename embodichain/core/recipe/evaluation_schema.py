"""The framework-owned `evaluation:` section (R-EVAL-1): a policy judged in closed loop.

Which environment (a registered gymnasium id with keyword arguments and an optional module to
import first, or the factory's own `module:callable` constructor), how many episodes from
which seed, their step and wall-clock limits, how many environments each rank steps at once
(in this process or one process each), how many episodes are filmed, and whether the model
or its EMA acts. Torch-free and gymnasium-free: validated with the rest of the recipe; the
environment itself is built (and refused, exit 2) before training (core/evaluation/envs.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    StrictInt,
    StrictStr,
    model_serializer,
    model_validator,
)

from embodichain.core.recipe.schema_base import SECTION_CONFIG, Section

_MODULE = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
ModuleName = Annotated[StrictStr, Field(pattern=rf"^{_MODULE}$")]
Constructor = Annotated[StrictStr, Field(pattern=rf"^{_MODULE}:[A-Za-z_][A-Za-z0-9_.]*$")]


class EnvConfig(Section):
    """`evaluation.env`: exactly one of `id` (gymnasium.make) or `constructor`."""

    # `import` is a Python keyword: the field is `import_module`, the recipe's key `import`
    # (and it is written back as `import`, so a stored recipe validates again).
    model_config = ConfigDict(**SECTION_CONFIG, populate_by_name=True)

    id: StrictStr | None = None
    """A registered gymnasium id, e.g. `InvertedPendulum-v5` or `gym_aloha/AlohaInsertion-v0`."""
    import_module: ModuleName | None = Field(None, alias="import")
    """A module imported before the environment is made (it registers the id)."""
    constructor: Constructor | None = None
    """`package.module:callable`, called with `kwargs` (and `render_mode`), returning a
    gymnasium.Env: the factory's own environment, unregistered."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of gymnasium.make / the constructor."""

    @model_validator(mode="after")
    def _one_way(self) -> EnvConfig:
        if (self.id is None) == (self.constructor is None):
            raise ValueError("give evaluation.env.id (a registered gymnasium id) or "
                             "evaluation.env.constructor ('package.module:callable'), "
                             "not both or neither")
        if self.id is not None and not self.id.strip():
            raise ValueError("evaluation.env.id: name the environment, e.g. "
                             "InvertedPendulum-v5")
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> Any:
        data = handler(self)
        if isinstance(data, dict) and "import_module" in data:
            data = {("import" if k == "import_module" else k): v for k, v in data.items()}
        return data

    @property
    def name(self) -> str:
        """The environment as messages name it."""
        return self.id if self.id is not None else str(self.constructor)


class EvaluationConfig(Section):
    """`evaluation`: closed-loop episodes at every validation and by `embodichain eval`."""

    env: EnvConfig
    episodes: PositiveInt = 50
    """Episodes per evaluation; episode e runs on rank e mod world size."""
    seed: StrictInt = 0
    """Episode e is reset with seed `seed + e`, whatever the world size: the validation
    seeds, which select `best.pt`."""
    test_seed: StrictInt | None = None
    """The first of the test seeds (`test_seed .. test_seed + test_episodes - 1`), which no
    validation touches: `embodichain eval`'s default, for the figures a run reports
    (R-TRUST-2). None: eval judges the validation seeds (selection and report not
    separated)."""
    test_episodes: PositiveInt | None = None
    """Episodes of the test seeds (default: `episodes`)."""
    max_steps: PositiveInt = 1000
    """An episode still running after this many steps is truncated (ends, judged as is)."""
    envs_per_rank: PositiveInt = 1
    """Environments each rank steps together: one batched policy forward per step."""
    vector: Literal["sync", "async"] = "sync"
    """`sync`: the environments step one after another in the training process; `async`:
    one process per environment (slow simulators; a hung step is cut off at the limit)."""
    videos: NonNegativeInt = 0
    """The first K episodes (by index) are rendered (`rgb_array`) and written as mp4."""
    acting: Literal["model", "ema"] = "model"
    """Which weights act: the model's own, or the EMA's (needs trainer.ema)."""
    episode_timeout_s: PositiveFloat = 300.0
    """Wall-clock limit of one episode: past it, the episode fails (reason `timeout`)."""
    video_fps: PositiveInt | None = None
    """Frames per second of the videos (default: the environment's `render_fps`, else 30)."""

    @model_validator(mode="after")
    def _test_apart(self) -> EvaluationConfig:
        if self.test_episodes is not None and self.test_seed is None:
            raise ValueError("evaluation.test_episodes needs evaluation.test_seed (the first "
                             "test seed)")
        if self.test_seed is not None:
            test = (self.test_seed, self.test_seed + (self.test_episodes or self.episodes) - 1)
            valid = (self.seed, self.seed + self.episodes - 1)
            if test[0] <= valid[1] and valid[0] <= test[1]:
                raise ValueError(
                    f"evaluation.test_seed: the test seeds {test[0]}..{test[1]} overlap the "
                    f"validation seeds {valid[0]}..{valid[1]} (evaluation.seed, episodes), "
                    "which select best.pt: the reported figure would come from seeds that "
                    f"chose the checkpoint. Start the test seeds from {valid[1] + 1} or "
                    "beyond (e.g. 200000)")
        return self


def evaluation_problems(evaluation: EvaluationConfig | None, ema_on: bool) -> list[str]:
    """What the rest of the recipe makes impossible for `evaluation`."""
    if evaluation is not None and evaluation.acting == "ema" and not ema_on:
        return ["evaluation.acting: ema needs trainer.ema (an exponential moving average "
                "of the weights); set trainer.ema.decay or use acting: model"]
    return []

