"""This process's peak resident memory, as the kernel counts it for this program alone.

``getrusage(RUSAGE_SELF).ru_maxrss`` is not that in a child started by ``subprocess``: Linux
keeps the high-water mark across ``execve``, so the child starts at its parent's peak at the
fork (a parent that generated a 100M-request trace made every child report 12.2 GiB).
``VmHWM`` in ``/proc/self/status`` belongs to the address space, which ``execve`` replaces.
"""

from __future__ import annotations

from pathlib import Path


def peak_rss_bytes() -> int:
    """The peak resident set of this process's program (``VmHWM``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line (not Linux?)")
