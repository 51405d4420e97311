"""The common supervised-learning parts, one sub-package per concern (SPEC §2, R-ARCH-1).

Bottom: `recipe`, `data` and `distributed` import no other sub-package. Then `checkpoint`,
`runs`, `observe` and `training`; `launch` on top. `errors` and `tensor_bytes` are the two
shared modules at the root. Import submodules directly: this package imports nothing, so the
CLI stays fast.
"""
