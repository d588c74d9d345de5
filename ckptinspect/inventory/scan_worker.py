"""The scan worker process's side (inventory/parallel.py starts it): scan headers read from stdin.

Protocol, over the two anonymous pipes of one child started with ``subprocess`` (a fresh interpreter,
like the ``spawn`` start method, on every platform; no ``multiprocessing``, so no resource tracker, no
re-import of the caller's ``__main__`` and no daemonic-process rule to trip):

- stdin: pickled ``(shard, header bytes, file size)`` tuples, then ``None``;
- stdout, once, after ``None``: the pickled list of ``(shard, ShardScan or None)`` in the order received
  (fingerprinted with header/index.py's ``name_fingerprint``: ``hash(str)`` differs in every process);
  None where the scan raised: the parent scans that shard itself, so its error is raised there, in
  index order, exactly as the in-process path raises it.

The worker dies with its parent: when the parent exits, is killed or closes the pipe, stdin ends (the
parent holds the only write end) and the worker exits without scanning further; a parent that is gone
when the results are written makes the write fail, which ends the worker too. Only the parent writes
into this pipe, so unpickling its data is unpickling our own process's objects.
"""

from __future__ import annotations

import gc
import pickle
import sys


def main() -> int:
    from ckptinspect.errors import CkptInspectError
    from ckptinspect.header.index import name_fingerprint
    from ckptinspect.inventory.scan import scan_header_unpaused

    gc.disable()  # the scans are acyclic; this process ends after one report (gc_pause.py says why)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    results = []
    while True:
        try:
            item = pickle.load(source)
        except (EOFError, OSError, pickle.UnpicklingError):
            return 0  # the parent is gone or stopped the scan: nothing to report to
        if item is None:
            break
        shard, header, file_size = item
        try:
            results.append((shard, scan_header_unpaused(shard, header, file_size, name_fingerprint)))
        except CkptInspectError:
            results.append((shard, None))
        del item, header
    try:
        pickle.dump(results, sink, protocol=pickle.HIGHEST_PROTOCOL)
        sink.flush()
    except OSError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
