"""Reading a streamed model's next decoder layer ahead (stream.py): disk -> host buffer -> device, on a
background thread and a side stream, while the layer before it computes."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ckptinspect.probe import loader


def layer_names(inventory, layer: int) -> list[str]:
    """The tensors of main-model decoder layer ``layer`` (not the MTP layer's), by the report's inventory."""
    return [n for g in inventory.groups if g.layer == layer and g.mtp_layer is None for n in g.names()]


class LayerReader:
    """Reads one decoder layer's stored (still quantized) bytes ahead, on one background thread: from
    the shards into a host buffer (pinned on a GPU; two, used in turn, each the largest layer's stored
    size, allocated once), then to the device on a side stream. Device memory: the stored bytes of the
    layer read ahead (``stream_estimate``'s "next layer"), beside the layer computing. When a tensor's
    dtype has no torch equivalent the main thread reads through safetensors as before (no overlap)."""

    def __init__(self, owner) -> None:
        self.owner, self.device = owner, owner.device
        cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        sizes = [sum(owner.metas[n].nbytes for n in layer_names(owner.inventory, i)) for i in range(len(owner.layers))]
        self.buffers = [torch.empty(max(sizes, default=0), dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
        self.offsets: dict[str, dict[str, tuple[int, int]]] = {}
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ckptinspect-layer-read")
        self.overlaps = True

    def submit(self, index: int) -> Future:
        return self.pool.submit(self._read, index, self.buffers[index % 2])

    def _read(self, index: int, buffer: torch.Tensor) -> tuple[dict[str, torch.Tensor] | None, float]:
        t0 = time.perf_counter()
        names = layer_names(self.owner.inventory, index)
        host = loader.read_stored(self.owner.model_dir, self.owner.metas, names, buffer, self.offsets)
        if host is None:
            self.overlaps = False
            return None, 0.0
        if self.stream is None:  # CPU: private copies (the buffer is reused two layers on)
            return {k: v.clone() for k, v in host.items()}, time.perf_counter() - t0
        with torch.cuda.stream(self.stream):
            on_device = {k: v.to(self.device, non_blocking=True) for k, v in host.items()}
        self.stream.synchronize()  # the buffer is free again and the tensors are whole
        return on_device, time.perf_counter() - t0

    def adopt(self, stored: dict[str, torch.Tensor] | None) -> None:
        """The main stream uses tensors the side stream allocated: tell the allocator, so that their
        memory is not handed out again before the main stream's work on them is done."""
        if stored and self.stream is not None:
            main = torch.cuda.current_stream(self.device)
            for t in stored.values():
                t.record_stream(main)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
