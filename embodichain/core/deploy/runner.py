"""Run an exported policy (`embodichain export --policy`) without the framework: this module
imports nothing of embodichain and no torch at module level (design R-LAYER-1), so it runs
on a robot holding numpy and onnxruntime alone (or copied there as one file).

An ONNX artifact needs numpy and onnxruntime only; a `.pt2` artifact needs torch (imported
when one is opened). The artifact carries its interface (design R-DEPLOY-1): the ONNX
model's metadata entry `embodichain.interface`, or the `.pt2` extra file `interface.json`,
a JSON document::

    {"format": 1, "kind": "policy" | "simulator_step",
     "observations": {KEY: {"shape": [...], "dtype": "float32", "meaning": "..."}, ...},
     "action": {"key": KEY, "shape": [chunk, action_dim], "dtype": "float32", "meaning": "..."},
     "fps": 30, "chunk": 8, "execution": {"horizon": H} | {"temporal_ensemble": M},
     "provenance": {"run_id", "update", "recipe_sha256", "packages", ...}}

Shapes are one example's, without the batch dimension; an observation with `"stack": n`
is given one step at a time and the model takes its last n (`[n, *shape]`, the runner
keeps them per batch slot). `PolicyRunner.predict` maps a batch
of observations to the model's output (a policy's action chunk `[B, chunk, action_dim]`, a
simulator step's next state); `PolicyRunner.act` executes the chunks step by step as the
interface says, one action `[B, action_dim]` per call, each batch slot an episode of its own
(`reset(i)` when slot i starts a new one). Usable as embodichain's closed-loop policy.

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

INTERFACE_KEY = "embodichain.interface"
"""The ONNX metadata_props entry holding the interface (JSON)."""
PT2_INTERFACE_FILE = "interface.json"
"""The `.pt2` extra file holding the interface (JSON)."""
FORMAT = 1


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
        """Open `path` (.onnx with onnxruntime on the CPU, .pt2 with torch). `threads`:
        onnxruntime's intra-op threads (None: its default)."""
        self.path = Path(path)
        forward, self.interface = _open(self.path, threads)
        self._forward = _checked_output(forward, self.interface, self.path)
        self.observation_keys = tuple(self.interface["observations"])
        self.kind = self.interface.get("kind", "policy")
        self._execution = (execution_for(self.interface) if self.kind == "policy" else None)
        self._frames = Frames([int(spec.get("stack", 0)) for spec in
                               self.interface["observations"].values()])

    def check(self, observations: Mapping[str, Any], *, step: bool = False
              ) -> tuple[list[np.ndarray], bool]:
        """The observation arrays in the model's input order and whether they came batched;
        ObservationError naming a missing or unknown key, a wrong shape or dtype. `step`:
        one step's observations (a stacked key's latest frame), else the model's inputs."""
        if not isinstance(observations, Mapping) and len(self.observation_keys) == 1:
            observations = {self.observation_keys[0]: observations}  # one key: a bare array
        if not isinstance(observations, Mapping):
            raise ObservationError(f"observations must be a mapping of "
                                   f"{list(self.observation_keys)} to arrays, got "
                                   f"{type(observations).__name__}")
        unknown = [k for k in observations if k not in self.interface["observations"]]
        missing = [k for k in self.observation_keys if k not in observations]
        if missing or unknown:
            said = ([f"missing {missing}"] if missing else []) + \
                   ([f"unknown {unknown}"] if unknown else [])
            raise ObservationError(f"observation keys: {', '.join(said)}; this policy takes "
                                   f"{list(self.observation_keys)}")
        arrays, batched = [], set()
        for key in self.observation_keys:
            spec, value = self.interface["observations"][key], observations[key]
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
                                               zip(self.observation_keys, arrays, strict=True)))
        return arrays, batched.pop()

    def predict(self, observations: Mapping[str, Any]) -> np.ndarray:
        """The model's output for these inputs (a policy's action chunk); a stacked key takes
        its whole stack `[stack, *shape]` here."""
        arrays, batched = self.check(observations)
        out = self._forward(arrays)
        return out if batched else out[0]

    def reset(self, env_index: int | None = None) -> None:
        """Slot `env_index` (every slot: None) starts a new episode."""
        if self._execution is None:
            raise ArtifactError(f"{self.path} is a {self.kind}, not a policy: use predict()")
        self._execution.reset(env_index)
        self._frames.reset(env_index)

    def act(self, observations: Mapping[str, Any]) -> np.ndarray:
        """This step's action `[B, action_dim]` (`[action_dim]` unbatched), the chunk
        execution applied; queries the model only when the execution needs a new chunk."""
        if self._execution is None:
            raise ArtifactError(f"{self.path} is a {self.kind}, not a policy: use predict()")
        arrays, batched = self.check(observations, step=True)
        arrays = self._frames.push(arrays)
        execution = self._execution
        execution.start(arrays[0].shape[0])
        chunk = self._forward(arrays) if execution.wants_chunk() else None
        action = execution.step(chunk)
        return action if batched else action[0]


class Frames:
    """The last `stack` observations of each stacked key per batch slot (oldest first; at
    an episode's start its first observation repeated), as the model takes them."""

    def __init__(self, stacks: Sequence[int]) -> None:
        self.stacks = list(stacks)
        self.history: list[np.ndarray | None] = [None] * len(stacks)
        self.fresh: np.ndarray | None = None

    def reset(self, env_index: int | None) -> None:
        if self.fresh is not None:
            if env_index is None:
                self.fresh[:] = True
            else:
                self.fresh[env_index] = True

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
        if self.t is not None:
            if env_index is None:
                self.t[:] = 0
            else:
                self.t[env_index] = 0

    def wants_chunk(self) -> bool:
        assert self.t is not None
        return bool((self.t % self.horizon == 0).any())

    def step(self, chunk: np.ndarray | None) -> np.ndarray:
        assert self.t is not None
        if chunk is not None:  # new plans for the slots at a horizon's start
            fresh = self.t % self.horizon == 0
            self.plan = chunk.copy() if self.plan is None else self.plan
            self.plan[fresh] = chunk[fresh]
        assert self.plan is not None
        action = self.plan[np.arange(len(self.t)), self.t % self.horizon]
        self.t += 1
        return action.astype(np.float32, copy=False)


class TemporalEnsemble:
    """ACT's temporal ensembling (`{"temporal_ensemble": m}`): a chunk every step; the action
    for step t is the average of every chunk's prediction for t, the one predicted i-th
    (oldest first) weighted exp(-m * i), computed by `ensembled` (the one arithmetic that
    the checkpoint's closed loop uses too)."""

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
        if self.count is not None:
            if env_index is None:
                self.count[:] = 0
            else:
                self.count[env_index] = 0

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
    """Temporal ensembling's arithmetic, defined once: `candidates[b, j]` is the prediction
    for this step that slot b's query of j steps ago made, the first `count[b]` of them real
    (queries since the slot's reset). In float64 whatever the chunk's dtype, the i-th real
    prediction (i = 0 the oldest) weighted w_i = exp(-m * i), summed oldest first, divided
    by the weights' sum; returned as float32. Per slot and elementwise, so the action does
    not depend on the batch's size or the other slots: a checkpoint and its artifact whose
    chunks are equal act equally (docs/deploy.md, "Parity")."""
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
    if not isinstance(interface, dict) or interface.get("format") != FORMAT:
        found = interface.get("format") if isinstance(interface, dict) else None
        raise ArtifactError(f"{path}: interface format {found!r}, this runner reads format "
                            f"{FORMAT}")
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
    return interface


def _checked_output(forward: Callable[[Sequence[np.ndarray]], np.ndarray],
                    interface: Mapping[str, Any], path: Path
                    ) -> Callable[[Sequence[np.ndarray]], np.ndarray]:
    """`forward`, refusing (ArtifactError) an output that is not `[B, *action shape]`: a
    shorter chunk than the interface declares would be executed as if it were whole."""
    want = tuple(int(d) for d in interface["action"]["shape"])

    def checked(arrays: Sequence[np.ndarray]) -> np.ndarray:
        out = forward(arrays)
        if tuple(out.shape[1:]) != want or out.shape[0] != arrays[0].shape[0]:
            raise ArtifactError(f"{path}: the model gives {list(out.shape)} for a batch of "
                                f"{arrays[0].shape[0]}, its interface declares "
                                f"[batch, *{list(want)}]")
        return out

    return checked


def _static_output(dims: Sequence[Any], interface: Mapping[str, Any], path: Path) -> None:
    """An ONNX output whose fixed dimensions contradict the interface's action shape."""
    want = list(interface["action"]["shape"])
    fixed = list(dims)[1:]
    if len(fixed) != len(want) or any(isinstance(d, int) and d != w
                                       for d, w in zip(fixed, want, strict=True)):
        raise ArtifactError(f"{path}: the model's output is [{', '.join(map(str, dims))}], "
                            f"its interface declares [batch, *{want}]")


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
    if names != list(interface["observations"]):  # the order too: inputs are positional
        raise ArtifactError(f"{path}: the model's inputs {names} are not its interface's "
                            f"observations {list(interface['observations'])}, in that order")
    output = session.get_outputs()[0].name
    _static_output(session.get_outputs()[0].shape, interface, path)

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
