"""The scripted bimanual experts of the ACT paper (Zhao et al. 2023), in the end-effector
scene: each arm follows timed waypoints of its gripper pose (xyz and a quaternion, wxyz)
and opening (1 open, 0 closed), planned from the objects' initial poses and linearly
interpolated between waypoints (quaternions component-wise, as the original does).

The waypoints are those of ACT's `scripted_policy.py` (transfer-cube: the right arm picks
the cube and meets the left, which takes it; insertion: the right arm picks the peg, the
left the socket, and they meet in the middle), with one change to the hand-over (R-ALOHA-2):
ACT's left arm closes on the point where the cube would be, planned before the episode; in
the joint-space scene, whose demonstrations are recorded, the right gripper holds the cube
2-3 cm higher than in the end-effector scene (there the cube slides down the loosening
grip into the left's fingers), so the left's upper finger bumps it (the first reward 4),
pushes it away, and the fingers close beside it: the cube falls when the right lets go.
Here the left waits at its approach point until the right holds the cube at the meeting
point (step 220), then goes to the cube where it is (`aim`, from the recorded scene's
object poses) and takes it; ACT's timing is otherwise kept."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np


def quaternion(axis: tuple[float, float, float], degrees: float) -> np.ndarray:
    """The unit quaternion (wxyz) rotating by `degrees` about `axis`."""
    half = math.radians(degrees) / 2
    a = np.asarray(axis, dtype=np.float64)
    return np.concatenate([[math.cos(half)], math.sin(half) * a / np.linalg.norm(a)])


def multiply(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The Hamilton product p q of quaternions (wxyz)."""
    pw, px, py, pz = p
    qw, qx, qy, qz = q
    return np.array([pw * qw - px * qx - py * qy - pz * qz,
                     pw * qx + px * qw + py * qz - pz * qy,
                     pw * qy - px * qz + py * qw + pz * qx,
                     pw * qz + px * qy - py * qx + pz * qw])


@dataclass(frozen=True)
class Waypoint:
    t: int
    xyz: np.ndarray
    quat: np.ndarray
    gripper: float


def _at(path: list[Waypoint], t: float) -> np.ndarray:
    """xyz, quaternion and opening at step t: linear between the surrounding waypoints."""
    before = max((w for w in path if w.t <= t), key=lambda w: w.t)
    after = min((w for w in path if w.t > t), key=lambda w: w.t, default=before)
    frac = (t - before.t) / (after.t - before.t + 1e-8)
    pose = [before.xyz + (after.xyz - before.xyz) * frac,
            before.quat + (after.quat - before.quat) * frac,
            [before.gripper + (after.gripper - before.gripper) * frac]]
    return np.concatenate(pose)


class WaypointExpert:
    """`expert(t)`: the end-effector action of step t (left arm's 8 values, then the
    right's), along the two arms' waypoints. `aim_step`/`aim`: at that step the recorder
    calls `aim(expert, t, objects)` with the objects' poses in the scene being recorded,
    which may re-plan the waypoints after t."""

    def __init__(self, left: list[Waypoint], right: list[Waypoint], aim_step: int | None = None,
                 aim: Callable[[WaypointExpert, int, np.ndarray], None] | None = None) -> None:
        self.left, self.right = left, right
        self.aim_step, self._aim = aim_step, aim

    def __call__(self, t: int) -> np.ndarray:
        return np.concatenate([_at(self.left, t), _at(self.right, t)])

    def observe(self, t: int, objects: np.ndarray) -> None:
        """The objects' poses at step t, before `self(t)` is asked for."""
        if self._aim is not None and t == self.aim_step:
            self._aim(self, t, objects)


def _shift_after(path: list[Waypoint], t: int, delta: np.ndarray) -> list[Waypoint]:
    """`path` moved by `delta` after step t, through a waypoint at t where it is now (no
    jump)."""
    now = _at(path, t)
    return ([w for w in path if w.t < t] + [_wp(t, now[:3], now[3:7], float(now[7]))]
            + [replace(w, xyz=w.xyz + delta) for w in path if w.t > t])


def _wp(t: int, xyz: np.ndarray, quat: np.ndarray, gripper: float) -> Waypoint:
    return Waypoint(t, np.asarray(xyz, dtype=np.float64), np.asarray(quat, dtype=np.float64),
                    gripper)


HANDOVER_STEP = 220
"""The right arm holds the cube at the meeting point from this step on."""
LEFT_FROM_CUBE = np.array([0.008, 0.0, -0.005])
"""Where the left gripper's mocap takes the cube, from the cube's centre as the right arm
holds it at the meeting point: ACT's plan in the end-effector scene (the left reaches
meet + (0.02, 0, -0.02) for a cube held at meet + (0.012, 0, -0.015) there)."""
REACH_STEP = 260
"""The left reaches the cube (and closes on it by 310)."""


def _left_to_the_cube(expert: WaypointExpert, t: int, objects: np.ndarray) -> None:
    planned = next(w.xyz for w in expert.left if w.t == REACH_STEP)
    expert.left = _shift_after(expert.left, t, objects[:3] + LEFT_FROM_CUBE - planned)


def transfer_cube(left: np.ndarray, right: np.ndarray, objects: np.ndarray) -> WaypointExpert:
    """Right arm: over the cube, down, close, to the meeting point, open, away. Left arm:
    to its approach point, waits for the cube, to the cube, close on it, away. `left`/
    `right`: the mocap poses (xyz, quaternion) at the start; `objects`: the cube's pose."""
    cube = objects[:3]
    pick = multiply(right[3:], quaternion((0, 1, 0), -60))
    meet_quat = quaternion((1, 0, 0), 90)
    meet = np.array([0.0, 0.5, 0.25])
    level = np.array([1.0, 0, 0, 0])
    return WaypointExpert(
        aim_step=HANDOVER_STEP, aim=_left_to_the_cube,
        left=[_wp(0, left[:3], left[3:], 0),
              _wp(100, meet + [-0.1, 0, -0.02], meet_quat, 1),   # approach the meeting point
              _wp(HANDOVER_STEP, meet + [-0.1, 0, -0.02], meet_quat, 1),  # wait there
              _wp(REACH_STEP, meet + [0.02, 0, -0.02], meet_quat, 1),  # reach the cube (aimed)
              _wp(310, meet + [0.02, 0, -0.02], meet_quat, 0),   # close on the cube
              _wp(360, meet + [-0.1, 0, -0.02], level, 0),       # pull it away
              _wp(400, meet + [-0.1, 0, -0.02], level, 0)],
        right=[_wp(0, right[:3], right[3:], 0),
               _wp(90, cube + [0, 0, 0.08], pick, 1),            # over the cube
               _wp(130, cube + [0, 0, -0.015], pick, 1),         # down
               _wp(170, cube + [0, 0, -0.015], pick, 0),         # close
               _wp(200, meet + [0.05, 0, 0], pick, 0),           # towards the meeting point
               _wp(220, meet, pick, 0),
               _wp(310, meet, pick, 1),                          # let go
               _wp(360, meet + [0.1, 0, 0], pick, 1),            # away
               _wp(400, meet + [0.1, 0, 0], pick, 1)])


def insertion(left: np.ndarray, right: np.ndarray, objects: np.ndarray) -> WaypointExpert:
    """Right arm picks the peg, left arm the socket; both lift them to the middle and push
    the peg into the socket. `objects`: the peg's pose, then the socket's."""
    peg, socket = objects[:3], objects[7:10]
    pick_right = multiply(right[3:], quaternion((0, 1, 0), -60))
    pick_left = multiply(right[3:], quaternion((0, 1, 0), 60))  # (the original's, from the right)
    meet = np.array([0.0, 0.5, 0.15])
    lift = 0.00715
    return WaypointExpert(
        left=[_wp(0, left[:3], left[3:], 0),
              _wp(120, socket + [0, 0, 0.08], pick_left, 1),
              _wp(170, socket + [0, 0, -0.03], pick_left, 1),
              _wp(220, socket + [0, 0, -0.03], pick_left, 0),
              _wp(285, meet + [-0.1, 0, 0], pick_left, 0),
              _wp(340, meet + [-0.05, 0, 0], pick_left, 0),
              _wp(400, meet + [-0.05, 0, 0], pick_left, 0)],
        right=[_wp(0, right[:3], right[3:], 0),
               _wp(120, peg + [0, 0, 0.08], pick_right, 1),
               _wp(170, peg + [0, 0, -0.03], pick_right, 1),
               _wp(220, peg + [0, 0, -0.03], pick_right, 0),
               _wp(285, meet + [0.1, 0, lift], pick_right, 0),
               _wp(340, meet + [0.05, 0, lift], pick_right, 0),
               _wp(400, meet + [0.05, 0, lift], pick_right, 0)])


EXPERTS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], WaypointExpert]] = {
    "transfer_cube": transfer_cube, "insertion": insertion}
