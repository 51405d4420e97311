"""The scripted bimanual experts of the ACT paper (Zhao et al. 2023), in the end-effector
scene: each arm follows timed waypoints of its gripper pose (xyz and a quaternion, wxyz)
and opening (1 open, 0 closed), planned from the objects' initial poses and linearly
interpolated between waypoints (quaternions component-wise, as the original does).

The waypoints are those of ACT's `scripted_policy.py` (transfer-cube: the right arm picks
the cube and meets the left, which takes it; insertion: the right arm picks the peg, the
left the socket, and they meet in the middle), with one change to the hand-over (R-ALOHA-2):
ACT's left arm sets off for the meeting point at step 100 and reaches it at 260, while the
right arm brings the cube there by 220. In the joint-space scene, whose demonstrations are
recorded, the right gripper holds the cube 2-3 cm higher than in the end-effector scene
(there it slides down the loosening grip), so the arriving left's finger bumps the cube
while it is still moving (the first reward 4, steps 205-212) and pushes it aside; the
fingers then close beside it and the cube falls when the right lets go: 0 of 50 replays
ended with the cube held. Here the left waits at its approach point until the right holds
the cube at the meeting point (`HANDOVER_STEP`), then reaches it by 260 as ACT's does:
50 of 50 hold it at the end. And one change to the insertion's end (R-TRUST-1): ACT's arms
stop at step 340 with the peg on the pin (the top reward, steps ~337-350), then the peg
springs back 3 mm off it and rests there to step 400 (reward 2: 0 of 50 still touched the
pin at the end). Here the arms keep closing by `PRESS` each from 340 to 400, holding the
peg against the pin to the end (47 of seeds 0-49 touch it at step 400). ACT's timing is
otherwise kept."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

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
    right's), open loop along the two arms' waypoints."""

    def __init__(self, left: list[Waypoint], right: list[Waypoint]) -> None:
        self.left, self.right = left, right

    def __call__(self, t: int) -> np.ndarray:
        return np.concatenate([_at(self.left, t), _at(self.right, t)])


def _wp(t: int, xyz: np.ndarray, quat: np.ndarray, gripper: float) -> Waypoint:
    return Waypoint(t, np.asarray(xyz, dtype=np.float64), np.asarray(quat, dtype=np.float64),
                    gripper)


HANDOVER_STEP = 220
"""The right arm holds the cube at the meeting point from this step on; the left waits
for it at its approach point until then."""


def transfer_cube(left: np.ndarray, right: np.ndarray, objects: np.ndarray) -> WaypointExpert:
    """Right arm: over the cube, down, close, to the meeting point, open, away. Left arm:
    to its approach point, waits there for the cube, to the meeting point, close on the
    cube, away. `left`/`right`: the mocap poses (xyz, quaternion) at the start;
    `objects`: the cube's pose."""
    cube = objects[:3]
    pick = multiply(right[3:], quaternion((0, 1, 0), -60))
    meet_quat = quaternion((1, 0, 0), 90)
    meet = np.array([0.0, 0.5, 0.25])
    level = np.array([1.0, 0, 0, 0])
    return WaypointExpert(
        left=[_wp(0, left[:3], left[3:], 0),
              _wp(100, meet + [-0.1, 0, -0.02], meet_quat, 1),   # approach the meeting point
              _wp(HANDOVER_STEP, meet + [-0.1, 0, -0.02], meet_quat, 1),  # wait there
              _wp(260, meet + [0.02, 0, -0.02], meet_quat, 1),   # reach it
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


PRESS = 0.01
"""How far (m) each arm keeps closing from step 340 to 400 of the insertion, pressing the
peg against the pin (ACT's arms hold still there)."""


def insertion(left: np.ndarray, right: np.ndarray, objects: np.ndarray) -> WaypointExpert:
    """Right arm picks the peg, left arm the socket; both lift them to the middle, push the
    peg into the socket and keep pressing it against the pin to the end. `objects`: the
    peg's pose, then the socket's."""
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
              _wp(400, meet + [-0.05 + PRESS, 0, 0], pick_left, 0)],
        right=[_wp(0, right[:3], right[3:], 0),
               _wp(120, peg + [0, 0, 0.08], pick_right, 1),
               _wp(170, peg + [0, 0, -0.03], pick_right, 1),
               _wp(220, peg + [0, 0, -0.03], pick_right, 0),
               _wp(285, meet + [0.1, 0, lift], pick_right, 0),
               _wp(340, meet + [0.05, 0, lift], pick_right, 0),
               _wp(400, meet + [0.05 - PRESS, 0, lift], pick_right, 0)])


EXPERTS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], WaypointExpert]] = {
    "transfer_cube": transfer_cube, "insertion": insertion}
