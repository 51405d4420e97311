"""Map-style datasets as training sources (R-DATA-1), and content digests of data files.

A `DatasetSource` wraps any object with `__len__` and `__getitem__(i) -> dict of tensors`
(a torch `Dataset`, an HDF5 reader, a decoder of compressed frames). The trainer loads its
examples through torch's DataLoader (`trainer.data_workers`, `trainer.prefetch`; see
`data/loader.py`), fed with the sampler's indices, so the trained model does not depend on
the number of worker processes.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from embodichain.core.data.digests import file_digest
from embodichain.core.errors import DataFormatError

__all__ = ["DatasetSource", "MapDataset", "file_digest"]


class MapDataset(Protocol):
    """What `DatasetSource` needs: a length and examples as dicts of tensors."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict[str, Any]: ...


class DatasetSource:
    """A map-style dataset as a training source.

    `identity` names the content (a checkpoint only resumes with the same data): pass a
    digest of the files the dataset reads, e.g. `file_digest(path)`, never a path or a time.
    Workers are forked, so a dataset's in-memory arrays are shared with them, not copied;
    open file handles that cannot cross a fork (HDF5) lazily, in `__getitem__` (R-DATA-6).
    """

    def __init__(self, dataset: MapDataset, identity: str) -> None:
        if not isinstance(identity, str) or not identity:
            raise ValueError("DatasetSource needs identity=..., a digest of the data's content "
                             "(e.g. file_digest(path)), so that a changed dataset refuses a "
                             "resume")
        length = len(dataset)
        if length <= 0:
            raise DataFormatError(f"the dataset is empty (len {length})")
        self.dataset = dataset
        self.identity = identity
        self._length = length

    def __len__(self) -> int:
        return self._length

    def gather(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """The examples at `indices`, loaded here and stacked (the `Source` protocol).

        The trainer does not call this: it loads through the DataLoader, with each example's
        random streams seeded (R-DATA-2).
        """
        from torch.utils.data import default_collate

        return default_collate([self.dataset[int(i)] for i in indices.tolist()])
