"""The persistent cache's size cap: delete the least recently used entries.

A module with no torchtpu (or torch, JAX) import, so that it runs as its own small,
low-priority process (``python -I cache_trim.py <dir> <max_bytes>``, started by
:mod:`torchtpu._device.persistent_cache` at most once an hour): scanning a cache of
160,000 entries takes 0.7 s of CPU with a warm file system cache and seconds with a
cold one, and in a thread of the user's process that scan held the GIL against the
user's training loop (a small DEFER_AND_FUSE training step measured 2.2 ms instead of
1.4 ms while it ran).
"""

from __future__ import annotations

import os
import sys

# the eager executor's executables stored by op signature (``eager.signature_cache``),
# a folder of the cache directory, trimmed with JAX's entries
SIGNATURE_DIR = "torchtpu-signatures"


def trim(path: str, max_bytes: int) -> int:
    """Delete the least recently used entries of the cache directory ``path`` (JAX's
    ``<key>-cache`` files and the signature cache's ``<key>.full`` / ``<key>.quick`` in
    ``SIGNATURE_DIR``; the last use is the later of the file's access and
    modification times) until their total size is at most 80% of ``max_bytes`` (bytes),
    if it exceeds ``max_bytes``.  Also deletes the ``<key>-atime`` files that JAX's own
    size cap wrote, which nothing reads now.  Returns the number of entries deleted.
    Never raises (an entry another process deletes meanwhile is skipped)."""
    entries, total = [], 0
    for folder, suffixes in ((path, ("-cache",)),
                             (os.path.join(path, SIGNATURE_DIR), (".full", ".quick"))):
        try:
            with os.scandir(folder) as it:
                for e in it:
                    try:
                        if e.name.endswith(suffixes):
                            st = e.stat()
                            entries.append((max(st.st_atime, st.st_mtime), st.st_size, e.path))
                            total += st.st_size
                        elif e.name.endswith("-atime"):
                            os.remove(e.path)
                    except OSError:
                        continue
        except OSError:
            if folder == path:
                return 0
    if total <= max_bytes:
        return 0
    entries.sort()
    deleted, target = 0, int(max_bytes * 0.8)
    for _, size, file in entries:
        if total <= target:
            break
        try:
            os.remove(file)
        except OSError:
            continue
        total -= size
        deleted += 1
    return deleted


if __name__ == "__main__":  # the trimming process: cache_trim.py <dir> <max_bytes>
    try:
        os.nice(19)  # the user's processes first
    except (AttributeError, OSError):
        pass
    trim(sys.argv[1], int(sys.argv[2]))
