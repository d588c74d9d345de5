"""The scan worker process's side (inventory/scan_process.py starts it): scan headers read from stdin.

Protocol, over the two anonymous pipes of one child started with ``subprocess`` (a fresh interpreter,
like the ``spawn`` start method, on every platform; no ``multiprocessing``, so no resource tracker, no
re-import of the caller's ``__main__`` and no daemonic-process rule to trip):

- stdin: first the index, ``("index-bytes", bytes)`` (the file as the Hub sent it) or ``("index",
  parsed)``; then ``(shard, header bytes, file size)`` tuples; then ``None``;
- stdout, once, after ``None``: the pickled ``(index_check, answers)``. ``index_check`` is this process's
  ``(counts, name_bytes)`` per shard of the index (header/index.py's ``summarize_index``), or None if it
  could not read the index; ``answers`` the list of ``(shard, ShardScan or None, names_match)`` in the order
  received, None where the scan raised (the parent scans that shard itself, so its error is raised there,
  in index order, exactly as the in-process path raises it).

The index cross-check is done here: ``hash(str)`` is seeded per process, so a ShardScan's ``name_hash``
from this process means nothing to the parent; this process compares it with its own summary of the same
index bytes (the same decoder, json_text.decode_json, as the parent's) and says whether the names match.
The parent checks that ``index_check`` equals its own summary before it trusts any answer.

The worker dies with its parent: when the parent exits, is killed or closes the pipe, stdin ends (the
parent holds the only write end) and the worker exits without scanning further; a parent that is gone
when the results are written makes the write fail, which ends the worker too. Only the parent writes
into this pipe, and both ends unpickle with a ``find_class`` that resolves nothing here and only the
scan's two record classes in the parent (scan_child.read_answers): no pickle names a callable to run.
"""

from __future__ import annotations

import gc
import pickle
import sys
from typing import Any

INDEX_SOURCE = "model.safetensors.index.json"


def _summarize(message: tuple[str, Any]) -> Any:
    from ckptinspect.header.index import summarize_index  # imported at start (main), before the index comes
    from ckptinspect.json_text import decode_json

    kind, payload = message
    index = decode_json(payload, source=INDEX_SOURCE) if kind == "index-bytes" else payload
    return summarize_index(index, source=INDEX_SOURCE)


class _Plain(pickle.Unpickler):
    """The parent's items hold only strings, bytes, numbers and containers: no class is resolved."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def main() -> int:
    from ckptinspect.errors import CkptInspectError
    from ckptinspect.header.index import summarize_index  # noqa: F401 - loaded while the index is on the wire
    from ckptinspect.inventory.scan import scan_header_unpaused

    gc.disable()  # the scans are acyclic; this process ends after one report (gc_pause.py says why)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    summary, answers = None, []
    while True:
        try:
            item = _Plain(source).load()  # one unpickler per item: its memo would keep every header alive
        except (EOFError, OSError, pickle.UnpicklingError):
            return 0  # the parent is gone or stopped the scan: nothing to report to
        if item is None:
            break
        if len(item) == 2:  # the index, once, before any header
            try:
                summary = _summarize(item)
            except (CkptInspectError, TypeError, KeyError, ValueError):
                summary = None
            del item
            continue
        shard, header, file_size = item
        try:
            scan = scan_header_unpaused(shard, header, file_size)
            match = summary is not None and summary.name_hashes.get(shard, 0) == scan.name_hash
            answers.append((shard, scan, match))
        except CkptInspectError:
            answers.append((shard, None, False))
        del item, header
    check = None if summary is None else (dict(summary.counts), dict(summary.name_bytes))
    try:
        pickle.dump((check, answers), sink, protocol=pickle.HIGHEST_PROTOCOL)
        sink.flush()
    except OSError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
