"""`python -m without_sim MODULE ARGS...`: run MODULE as `python -m` would, in a process
where gym-aloha, dm_control and MuJoCo cannot be imported (as without the `[sim]` extra)."""

import runpy
import sys

for name in ("gym_aloha", "dm_control", "mujoco"):
    sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError

module, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
