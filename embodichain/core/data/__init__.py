"""Training data: the `Source` protocol and in-memory tensor corpora with their content
identity (`source`), map-style datasets as sources (`dataset_source`), the per-rank samplers
that draw indices (`samplers`: with replacement, epochs), the loading of batches in data
workers (`loader`) and an update's micro-batches (`micro_batches`) (R-DIST-4, §11)."""
