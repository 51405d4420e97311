"""Training data: the `Source` protocol, in-memory tensor corpora, their content identity
and the per-rank samplers that draw indices from them (R-DIST-4, §11)."""
