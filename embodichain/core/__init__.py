"""The common supervised-learning parts, one sub-package per concern (design §2, R-ARCH-1).

Bottom: `recipe`, `data` and `distributed` import no other sub-package. Then `checkpoint`,
`runs`, `observe` and `training`; `launch` on top. `errors` and `tensor_bytes` are the two
shared modules at the root. Import submodules directly: this package imports nothing, so the
CLI stays fast. The ids the code cites (`R-RESUME-1`) and its sections (`design §9`) are
defined in docs/design.md.
"""
