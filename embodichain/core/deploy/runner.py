"""Run an exported policy (`embodichain export --policy`) without the framework: this module
imports nothing of embodichain and no torch at module level (design R-LAYER-1), so it runs
on a robot holding numpy and onnxruntime alone (or copied there as one file).

An ONNX artifact needs numpy and onnxruntime only; a `.pt2` artifact needs torch (imported
when one is opened). The artifact carries its interface (design R-DEPLOY-1; docs/deploy.md
says each field), JSON in the ONNX metadata entry `embodichain.interface` or the `.pt2`
extra file `interface.json`: `format` (1; 2 with `noise`), `kind` ("policy" or
"simulator_step"), `observations` {key: {shape, dtype, meaning[, stack]}}, `action` {key,
shape [chunk, action_dim], dtype, meaning}, `fps`, `chunk`, `execution` ({"horizon": h} or
{"temporal_ensemble": m}), `noise` {key, shape, dtype float32, **NOISE_RULE} and
`provenance`. Shapes are one example's, without the batch dimension; of an observation with
`"stack": n` the model takes the last n steps (`[n, *shape]`, the runner keeps them per batch
slot); a sampler's model takes its `noise` last, which `act` draws (`episode_noise`).
`predict` maps a batch of the model's inputs to its output (a policy's action chunk
`[B, chunk, action_dim]`, a simulator step's next state); `act` executes the chunks as the
interface says, one action `[B, action_dim]` per call, each batch slot an episode of its
own (`reset(i)` when slot i starts one). Usable as embodichain's closed-loop policy.

    runner = PolicyRunner("policy.onnx")
    runner.reset()
    action = runner.act({"observation.state": state[None], ...})[0]
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

INTERFACE_KEY = "embodichain.interface"  # the ONNX metadata_props entry holding the interface
PT2_INTERFACE_FILE = "interface.json"  # the `.pt2` extra file holding it
FORMATS = (1, 2)  # 2: format 1 and a `noise` drawn by NOISE_RULE (`episode_noise`)
NOISE_RULE = {"kind": "gaussian", "keying": "episode_seed,sample", "version": 1}


def episode_noise(seed: int, sample: int, shape: Sequence[int]) -> np.ndarray:
    """The noise of an episode's `sample`-th model query (0 the first after its reset):
    float32 standard normal `shape`, numpy's PCG64 seeded by SeedSequence([seed mod 2^64,
    sample]). The checkpoint's policy draws by this rule too, so the artifact acts as it."""
    bits = np.random.PCG64(np.random.SeedSequence([int(seed) % 2**64, int(sample)]))
    return np.random.Generator(bits).standard_normal(tuple(shape), dtype=np.float32)


class ObservationError(ValueError):
    """An observation that does not match the artifact's interface (names what differs)."""


class ArtifactError(ValueError):
    """A file that is not an exported embodichain policy (names what is missing)."""


def read_interface(path: str | Path) -> dict[str, Any]:
    """The interface stored in the artifact at `path` (.onnx or .pt2)."""
    return _open(Path(path), threads=None)[1]


class PolicyRunner:
    """An exported artifact behind its interface: observations checked, chunks executed."""

    def __init__(self, path: str | Path, *, threads: int | None = None) -> None:
        """Open `path`: .onnx with onnxruntime on the CPU (`threads` intra-op), .pt2 torch."""
        self.path = Path(path)
        self._model, self.interface = _open(self.path, threads)
        self.observation_keys = tuple(self.interface["observations"])
        self.noise = self.interface.get("noise")  # a sampler's noise, drawn by `act`
        self._inputs = input_specs(self.interface)
        self.kind = self.interface.get("kind", "policy")
        self._execution = (execution_for(self.interface) if self.kind == "policy" else None)
        stacks = [int(o.get("stack", 0)) for o in self.interface["observations"].values()]
        self._frames = Frames(stacks)
        self._episodes: dict[int, list[int]] = {}  # slot: [its episode's seed, noises drawn]

    def check(self, observations: Mapping[str, Any], *, step: bool = False
              ) -> tuple[list[np.ndarray], bool]:
        """The arrays in the model's input order and whether they came batched, else
        ObservationError naming a missing or unknown key, a wrong shape or dtype. `step`:
        one step's observations (a stacked key's latest frame), else the model's inputs."""
        keys = self.observation_keys if step else tuple(self._inputs)
        if not isinstance(observations, Mapping) and len(keys) == 1:
            observations = {keys[0]: observations}  # one key: a bare array
        if not isinstance(observations, Mapping):
            raise ObservationError(f"observations must be a mapping of {list(keys)} to "
                                   f"arrays, got {type(observations).__name__}")
        unknown = [k for k in observations if k not in keys]
        missing = [k for k in keys if k not in observations]
        if missing or unknown:
            said = [f"{what} {keys}" for what, keys in (("missing", missing),
                                                        ("unknown", unknown)) if keys]
            raise ObservationError(f"observation keys: {', '.join(said)}; this policy takes "
                                   f"{list(keys)}")
        arrays, batched = [], set()
        for key in keys:
            spec, value = self._inputs[key], observations[key]
            array = value if isinstance(value, np.ndarray) else _as_numpy(value, key)
            want = tuple(spec["shape"])
            if spec.get("stack") and not step:
                want = (int(spec["stack"]), *want)
            if array.dtype != np.dtype(spec["dtype"]):
                raise ObservationError(f"observation {key!r}: dtype {array.dtype}, the policy "
                                       f"takes {spec['dtype']}")
            if array.shape[1:] == want:
                batched.add(True)
            elif array.shape == want:
                batched.add(False)
                array = array[None]
            else:
                raise ObservationError(f"observation {key!r}: shape {list(array.shape)}, the "
                                       f"policy takes {list(want)} (or [batch, *{list(want)}])")
            arrays.append(np.ascontiguousarray(array))
        if len(batched) > 1 or len({a.shape[0] for a in arrays}) > 1:
            raise ObservationError("observations differ in batch size: "
                                   + ", ".join(f"{k} {list(a.shape)}" for k, a in
                                               zip(keys, arrays, strict=True)))
        return arrays, batched.pop()

    def predict(self, observations: Mapping[str, Any]) -> np.ndarray:
        """The model's output for these inputs (a policy's action chunk); a stacked key takes
        its whole stack `[stack, *shape]` here."""
        arrays, batched = self.check(observations)
        out = self._forward(arrays)
        return out if batched else out[0]

    def reset(self, env_index: int | None = None) -> None:
        """Slot `env_index` (every slot: None) starts a new episode."""
        self._policy().reset(env_index)
        self._frames.reset(env_index)
        if env_index is None:
            self._episodes.clear()
        else:
            self._episodes.pop(env_index, None)

    def seed_episode(self, env_index: int, seed: int) -> None:
        """Slot `env_index`'s episode (after its `reset`) draws its noise from `seed` (else 0)."""
        self._episodes[env_index] = [int(seed), 0]

    def act(self, observations: Mapping[str, Any]) -> np.ndarray:
        """This step's action `[B, action_dim]` (`[action_dim]` unbatched), the chunk
        execution applied; queries the model only when the execution needs a new chunk."""
        execution = self._policy()
        arrays, batched = self.check(observations, step=True)
        arrays = self._frames.push(arrays)
        execution.start(arrays[0].shape[0])
        chunk = None
        if execution.wants_chunk():
            chunk = self._sampled(arrays) if self.noise else self._forward(arrays)
        action = execution.step(chunk)
        return action if batched else action[0]

    def _policy(self) -> Horizon | TemporalEnsemble:
        if self._execution is None:
            raise ArtifactError(f"{self.path} is a {self.kind}, not a policy: use predict()")
        return self._execution

    def _forward(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """The model's output, refused (ArtifactError) unless `[B, *action shape]`: a shorter
        chunk than the interface declares would be executed as if it were whole."""
        out, want = self._model(arrays), (arrays[0].shape[0], *self.interface["action"]["shape"])
        if tuple(out.shape) != want:
            raise ArtifactError(f"{self.path}: the model gives {list(out.shape)} for a batch of "
                                f"{want[0]}, its interface declares [batch, *{list(want[1:])}]")
        return out

    def _sampled(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        """Each slot taking a chunk samples it from its episode's next noise, alone, as the
        checkpoint's policy does (a batched convolution's last bits depend on other rows)."""
        assert self.noise is not None
        fresh = self._policy().fresh()
        chunk = np.zeros((len(fresh), *self.interface["action"]["shape"]), np.float32)
        for i in map(int, np.flatnonzero(fresh)):
            episode = self._episodes.setdefault(i, [0, 0])
            noise = episode_noise(*episode, self.noise["shape"])
            episode[1] += 1
            chunk[i] = self._forward([a[i:i + 1] for a in arrays] + [noise[None]])[0]
        return chunk


class Frames:
    """The last `stack` observations of each stacked key per batch slot (oldest first; at
    an episode's start its first observation repeated), as the model takes them."""

    def __init__(self, stacks: Sequence[int]) -> None:
        self.stacks = list(stacks)
        self.history: list[np.ndarray | None] = [None] * len(stacks)
        self.fresh: np.ndarray | None = None

    def reset(self, env_index: int | None) -> None:
        _set_slot(self.fresh, env_index, True)

    def push(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        batch = arrays[0].shape[0]
        if self.fresh is None or len(self.fresh) != batch:
            self.fresh, self.history = np.ones(batch, bool), [None] * len(self.stacks)
        out = []
        for i, (stack, array) in enumerate(zip(self.stacks, arrays, strict=True)):
            if not stack:
                out.append(array)
                continue
            old = self.history[i]
            new = (np.repeat(array[:, None], stack, axis=1) if old is None else
                   np.concatenate([old[:, 1:], array[:, None]], axis=1))
            new[self.fresh] = np.repeat(array[self.fresh][:, None], stack, axis=1)
            self.history[i] = new
            out.append(new)
        self.fresh[:] = False
        return out


class Horizon:
    """Execute the first `h` actions of each chunk, then look again (`{"horizon": h}`)."""

    def __init__(self, horizon: int, chunk: int) -> None:
        if not 1 <= horizon <= chunk:
            raise ArtifactError(f"execution horizon {horizon} is outside 1..chunk ({chunk})")
        self.horizon = horizon
        self.t: np.ndarray | None = None
        self.plan: np.ndarray | None = None

    def start(self, batch: int) -> None:
        if self.t is None or len(self.t) != batch:
            self.t, self.plan = np.zeros(batch, dtype=np.int64), None

    def reset(self, env_index: int | None) -> None:
        _set_slot(self.t, env_index, 0)

    def fresh(self) -> np.ndarray:  # the slots taking this step's chunk
        assert self.t is not None
        return self.t % self.horizon == 0

    def wants_chunk(self) -> bool:
        return bool(self.fresh().any())

    def step(self, chunk: np.ndarray | None) -> np.ndarray:
        assert self.t is not None
        if chunk is not None:  # new plans for the slots at a horizon's start
            fresh = self.fresh()
            self.plan = chunk.copy() if self.plan is None else self.plan
            self.plan[fresh] = chunk[fresh]
        assert self.plan is not None
        action = self.plan[np.arange(len(self.t)), self.t % self.horizon]
        self.t += 1
        return action.astype(np.float32, copy=False)


class TemporalEnsemble:
    """ACT's temporal ensembling (`{"temporal_ensemble": m}`): a chunk every step; the action
    for step t averages every chunk's prediction for t, the i-th (oldest first) weighted
    exp(-m * i), by `ensembled` (the one arithmetic the checkpoint's closed loop uses too)."""

    def __init__(self, coefficient: float, chunk: int) -> None:
        self.m, self.chunk = float(coefficient), chunk
        self.history: np.ndarray | None = None  # [B, chunk (queries, newest last), chunk, A]
        self.count: np.ndarray | None = None  # queries since each slot's reset
        ago = np.arange(chunk)  # the query made j steps ago predicted this step at index j
        self._rows, self._cols = chunk - 1 - ago, ago

    def start(self, batch: int) -> None:
        if self.count is None or len(self.count) != batch:
            self.count, self.history = np.zeros(batch, dtype=np.int64), None

    def reset(self, env_index: int | None) -> None:
        _set_slot(self.count, env_index, 0)

    def fresh(self) -> np.ndarray:
        assert self.count is not None
        return np.ones(len(self.count), bool)

    def wants_chunk(self) -> bool:
        return True

    def step(self, chunk: np.ndarray | None) -> np.ndarray:
        assert chunk is not None and self.count is not None
        if self.history is None:
            self.history = np.zeros((chunk.shape[0], self.chunk, *chunk.shape[1:]), chunk.dtype)
        self.history = np.roll(self.history, -1, axis=1)
        self.history[:, -1] = chunk
        self.count = np.minimum(self.count + 1, self.chunk)
        return ensembled(self.history[:, self._rows, self._cols], self.count, self.m)


def ensembled(candidates: np.ndarray, count: np.ndarray, m: float) -> np.ndarray:
    """Temporal ensembling's arithmetic, defined once: `candidates[b, j]` is slot b's
    prediction for this step made j steps ago, the first `count[b]` real (since its reset).
    In float64, the i-th real one (i = 0 the oldest) weighted exp(-m * i), summed oldest
    first, over the weights' sum, as float32; per slot and elementwise, so equal chunks act
    equally whatever the batch (docs/deploy.md, "Parity")."""
    batch, depth = candidates.shape[:2]
    n = np.asarray(count, dtype=np.int64).reshape(batch, 1)
    ago = np.arange(depth)[None, :]
    real = ago < n  # [B, depth]: the predictions made since the slot's reset
    weights = np.where(real, np.exp(-m * np.maximum(n - 1 - ago, 0)), 0.0)
    expand = (batch, depth) + (1,) * (candidates.ndim - 2)
    values = np.where(real.reshape(expand), candidates.astype(np.float64), 0.0)
    weighted = weights.reshape(expand) * values
    total = np.zeros(batch)
    action = np.zeros((batch, *candidates.shape[2:]))
    for j in reversed(range(depth)):  # oldest first (what is not real adds an exact 0)
        total += weights[:, j]
        action += weighted[:, j]
    expand = (batch,) + (1,) * (candidates.ndim - 2)
    return (action / total.reshape(expand)).astype(np.float32)


def execution_for(interface: Mapping[str, Any]) -> Horizon | TemporalEnsemble:
    """The chunk execution the interface names."""
    execution, chunk = interface.get("execution") or {}, int(interface["chunk"])
    if "horizon" in execution:
        return Horizon(int(execution["horizon"]), chunk)
    if "temporal_ensemble" in execution:
        m = float(execution["temporal_ensemble"])
        if not math.isfinite(m):
            raise ArtifactError(f"temporal_ensemble coefficient {m} is not finite")
        return TemporalEnsemble(m, chunk)
    raise ArtifactError(f"unknown chunk execution {execution!r}; expected "
                        "{'horizon': h} or {'temporal_ensemble': m}")


def input_specs(interface: Mapping[str, Any]) -> dict[str, Any]:
    """The model's inputs in order: the observations, then the noise if it takes one."""
    noise = interface.get("noise")
    return {**interface["observations"], **({noise["key"]: noise} if noise else {})}


def _set_slot(array: np.ndarray | None, env_index: int | None, value: Any) -> None:
    if array is not None:  # slot env_index's entry, every slot's for None
        array[slice(None) if env_index is None else env_index] = value


def _as_numpy(value: Any, key: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor (on the CPU)
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except Exception as exc:
        raise ObservationError(f"observation {key!r}: not an array ({exc})") from None


def _open(path: Path, threads: int | None
          ) -> tuple[Callable[[Sequence[np.ndarray]], np.ndarray], dict[str, Any]]:
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file")
    if path.suffix == ".onnx":
        return _open_onnx(path, threads)
    if path.suffix == ".pt2":
        return _open_pt2(path)
    raise ArtifactError(f"{path}: an exported policy ends in .onnx or .pt2")


def _parse_interface(text: str | None, path: Path) -> dict[str, Any]:
    if not text:
        raise ArtifactError(f"{path} carries no embodichain interface: it was not written by "
                            "`embodichain export --policy`")
    try:
        interface = json.loads(text)
    except ValueError as exc:
        raise ArtifactError(f"{path}: its interface is not JSON ({exc})") from None
    if not isinstance(interface, dict) or interface.get("format") not in FORMATS:
        found = interface.get("format") if isinstance(interface, dict) else None
        raise ArtifactError(f"{path}: interface format {found!r}, this runner reads formats "
                            f"{list(FORMATS)}")
    observations, action = interface.get("observations"), interface.get("action")
    if not isinstance(observations, dict) or not observations or not all(
            isinstance(v, dict) and "shape" in v and "dtype" in v
            for v in observations.values()) or not isinstance(action, dict) \
            or "shape" not in action:
        raise ArtifactError(f"{path}: its interface lacks observations or an action "
                            "(each with shape and dtype)")
    if interface.get("kind", "policy") == "policy" and (
            not action["shape"] or action["shape"][0] != interface.get("chunk")):
        raise ArtifactError(f"{path}: its action shape {action['shape']} does not start with "
                            f"its chunk {interface.get('chunk')!r}")
    noise = interface.get("noise")
    if noise is not None and not (
            isinstance(noise, dict) and interface["format"] >= 2
            and all(noise.get(k) == v for k, v in NOISE_RULE.items())
            and noise.get("key") not in (None, *observations) and noise.get("dtype") == "float32"
            and isinstance(noise.get("shape"), list) and noise["shape"]
            and all(isinstance(d, int) and d > 0 for d in noise["shape"])):
        raise ArtifactError(f"{path}: its noise declaration {noise!r} is not one this runner "
                            f"can draw (format 2: key, shape, dtype float32, {NOISE_RULE})")
    return interface


def _open_onnx(path: Path, threads: int | None
               ) -> tuple[Callable[[Sequence[np.ndarray]], np.ndarray], dict[str, Any]]:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ImportError(f"running an ONNX artifact needs onnxruntime ({exc})",
                          name="onnxruntime") from None

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own types: InvalidProtobuf, Fail
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ArtifactError(f"{path} is not an ONNX model onnxruntime can load "
                            f"({type(exc).__name__}: {first})") from None
    interface = _parse_interface(
        session.get_modelmeta().custom_metadata_map.get(INTERFACE_KEY), path)
    names = [i.name for i in session.get_inputs()]
    wanted = list(input_specs(interface))
    if names != wanted:  # the order too: inputs are positional
        raise ArtifactError(f"{path}: the model's inputs {names} are not its interface's "
                            f"observations {wanted}, in that order")
    output, dims = session.get_outputs()[0].name, list(session.get_outputs()[0].shape)
    want = list(interface["action"]["shape"])  # fixed dimensions contradicting it: refused
    if len(dims) != len(want) + 1 or any(isinstance(d, int) and d != w
                                         for d, w in zip(dims[1:], want, strict=True)):
        raise ArtifactError(f"{path}: the model's output is [{', '.join(map(str, dims))}], "
                            f"its interface declares [batch, *{want}]")

    def forward(arrays: Sequence[np.ndarray]) -> np.ndarray:
        return session.run([output], dict(zip(names, arrays, strict=True)))[0]

    return forward, interface


def _open_pt2(path: Path) -> tuple[Callable[[Sequence[np.ndarray]], np.ndarray], dict[str, Any]]:
    import torch

    extra = {PT2_INTERFACE_FILE: ""}
    if not zipfile.is_zipfile(path):  # torch would log its fallback's traceback first
        raise ArtifactError(f"{path} is not a torch.export program torch can load (not a "
                            "zip archive)")
    try:
        program = torch.export.load(str(path), extra_files=extra)
    except Exception as exc:  # noqa: BLE001 - BadZipFile, RuntimeError, KeyError, ...
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ArtifactError(f"{path} is not a torch.export program torch can load "
                            f"({type(exc).__name__}: {first})") from None
    interface = _parse_interface(extra[PT2_INTERFACE_FILE], path)
    module = program.module()
    # The graph's own forward, without the module's pre-hooks: they re-check the inputs
    # against the export's constraints through pytree walks on every call (the runner has
    # checked them against the interface) and enable nn.Module inputs (a policy has none).
    graph_forward = module.forward

    def forward(arrays: Sequence[np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return graph_forward(*(torch.from_numpy(a) for a in arrays)).numpy()

    return forward, interface
