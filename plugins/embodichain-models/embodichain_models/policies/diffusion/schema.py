"""The ALOHA Diffusion Policy recipe's own sections (no torch at import: registered in
`embodichain.sl_schemas`). The data, task and cameras are ACT's (`policies/act`); the
closed-loop judge is the framework's `evaluation:` section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from embodichain.learning.sl import Section
from embodichain_models.policies.act.schema import DatasetRoot, known_task


class ModelSection(Section):
    """Diffusion Policy's sizes and sampler (lerobot's names where it has them)."""

    horizon: PositiveInt = 16
    """Actions the U-Net denoises at once: the frame's own action and the next horizon-1.
    A multiple of 2^(len(down_dims)-1), which the U-Net halves and doubles."""
    n_obs_steps: PositiveInt = 2
    """Observations the policy is conditioned on: frames t-n+1..t (the first one repeated
    at an episode's start)."""
    n_action_steps: PositiveInt = 8
    """Actions executed of each sampled horizon before the next is sampled."""
    temporal_ensemble: PositiveFloat | None = None
    """Or ACT's temporal ensembling when acting: a horizon sampled every step, the action
    the average of every horizon's prediction for the step, weighted exp(-m i) with i = 0
    the oldest (ACT: m = 0.01); its m. Acting only: the training is the same, so a trained
    checkpoint can be judged with it (`embodichain eval CKPT --set
    model.temporal_ensemble=0.01`). With it, `n_action_steps` is not used."""
    down_dims: list[PositiveInt] = Field(default_factory=lambda: [64, 128, 256], min_length=1)
    """The U-Net's widths, one level each (lerobot: 512, 1024, 2048)."""
    kernel_size: PositiveInt = 5
    groups: PositiveInt = 8
    """GroupNorm groups in the U-Net's convolution blocks."""
    step_embedding: PositiveInt = 64
    """Width of the diffusion step's sinusoidal embedding (lerobot: 128)."""
    film_scale: bool = True
    """FiLM with a scale and a bias per channel (else a bias only)."""
    channels: PositiveInt = 32
    """Width of the camera backbone (ACT's: a ResNet-18 layout with GroupNorm, from
    scratch, stages of 1, 2, 4, 8 times it)."""
    keypoints: PositiveInt = 32
    """Maps the backbone's last stage is projected to (1x1 conv), pooled by `image_pooling`
    (lerobot: 32 spatial-softmax keypoints)."""
    image_features: PositiveInt = 64
    """Width of a camera's feature per frame (the pooled maps through a linear layer)."""
    image_pooling: Literal["keypoints", "flatten"] = "keypoints"
    """How a camera's `keypoints` maps become its feature: `keypoints`, each map's
    spatial-softmax (x, y) (lerobot's); `flatten`, every cell of every map through the
    linear layer (at 120x160 the maps are 4x5 cells, where the expected position of a map
    says little of where a small object is)."""
    image_shift: NonNegativeInt = 0
    """Random shift augmentation in training (pixels at the backbone's resolution)."""
    train_timesteps: PositiveInt = 100
    """DDPM noise levels in training (squared-cosine schedule)."""
    sampling_steps: PositiveInt = 10
    """DDIM steps when acting (a divisor of train_timesteps' range: at most it)."""
    prediction: Literal["epsilon", "sample"] = "epsilon"
    """What the U-Net predicts of a noised horizon: its noise (DDPM's and the paper's
    default) or the clean horizon itself (lerobot's `prediction_type: sample`)."""
    state_noise: NonNegativeFloat = 0.0
    """Standard deviation of Gaussian noise added in training to each frame's joint
    positions, normalised to [-1, 1], the target horizon unchanged: the policy learns to steer
    back to the demonstrations' path from joints off it, and cannot read the joints'
    velocity from two frames 20 ms apart and follow its own drift (0: none)."""
    state_dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    """Probability that a training example's joint positions (every frame of its history)
    are withheld: zeroed, with a per-frame flag the policy reads (always 1 when acting).
    Those examples are predicted from the camera alone, so the image feature keeps saying
    where the cube (and the arms) are when the joints and their history would predict the
    demonstrations' horizon without it (0: never)."""
    clip_sample: PositiveFloat | None = 1.0
    """The denoised horizon's estimate is clipped to +-this (actions are min-max
    normalised to [-1, 1]); null: not clipped."""

    @model_validator(mode="after")
    def _fits(self) -> ModelSection:
        factor = 2 ** (len(self.down_dims) - 1)
        if self.horizon % factor:
            raise ValueError(f"model.horizon ({self.horizon}) must be a multiple of {factor}: "
                             f"the U-Net halves it {len(self.down_dims) - 1} times (one per "
                             "model.down_dims level after the first) and doubles it back")
        for width in self.down_dims:
            if width % self.groups:
                raise ValueError(f"model.down_dims: width {width} is not a multiple of "
                                 f"model.groups ({self.groups})")
        if self.n_action_steps > self.horizon:
            raise ValueError(f"model.n_action_steps ({self.n_action_steps}) exceeds "
                             f"model.horizon ({self.horizon})")
        if self.sampling_steps > self.train_timesteps:
            raise ValueError(f"model.sampling_steps ({self.sampling_steps}) exceeds "
                             f"model.train_timesteps ({self.train_timesteps})")
        return self


class DataSection(Section):
    # `root` comes after `task` and `cameras`: a missing dataset's hint records them.
    task: Annotated[str, AfterValidator(known_task)] = "transfer_cube"
    """The task the dataset shows (checked against its task text) and the evaluation runs."""
    cameras: list[str] = Field(default_factory=list)
    """Cameras the policy sees (gym-aloha's `pixels_agent_pos`: [top]); none: privileged
    state (joint positions and object poses), as ACT's recipe."""
    root: DatasetRoot
    """The LeRobot v3.0 dataset written by the ALOHA prepare command."""
    val_episodes: NonNegativeInt = 0
    """The last N episodes are held out: their noise-prediction error is validated."""
    identity: Literal["content", "metadata"] = "content"
    """What the data's identity digests (see the ACT recipe's data section)."""


class DiffusionConfig(BaseModel):
    """Recipe-owned sections of the ALOHA Diffusion Policy recipe."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
