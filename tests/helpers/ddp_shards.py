"""What Lightning does to a training loader under DDP, without processes (private API:
``data_connector._request_dataloader``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def distributed_shards(make_loader: Callable[[], Any], replicas: int = 2) -> tuple[Any, list[set[int]]]:
    """The loader ``make_loader`` builds (as Lightning records it) and the sentence indices each of
    ``replicas`` ranks reads once Lightning has put a ``DistributedSampler`` in."""
    from lightning_fabric.utilities.data import _replace_dunder_methods
    from pytorch_lightning.utilities.data import _update_dataloader
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
        loader = make_loader()
    shards = []
    for rank in range(replicas):
        sampler = DistributedSampler(loader.dataset, num_replicas=replicas, rank=rank, shuffle=True)
        updated = _update_dataloader(loader, sampler)
        assert type(updated.batch_sampler) is type(loader.batch_sampler)
        shards.append({i for batch in updated for i in batch["index"].tolist()})
    return loader, shards
