"""The end-to-end benchmark's own logic (``perf/e2e.py``): CPU time and memory of a process tree
read from /proc, the guard's decision and its kill, disk use, per-stage CPU from the samples."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from perf.e2e import (
    GIB,
    CpuAccount,
    Limits,
    cpu_between,
    disk_bytes,
    kill_tree,
    process_tree,
    run_watched,
    tree_memory_bytes,
)


def _process(
    proc: Path,
    pid: int,
    *,
    started: int,
    utime: int,
    stime: int,
    children: tuple[int, ...] = (),
    pss_kib: int | None = None,
    rss_kib: int | None = None,
    name: str = "python",
) -> None:
    """A /proc/<pid> as the kernel shows it: stat (fields after the name: state, ppid, …,
    utime is the 14th field, stime the 15th, starttime the 22nd), the children list, and
    smaps_rollup or status for the memory. A child's cumulative ticks (cutime, cstime) are
    filled with large values: they must not be counted."""
    folder = proc / str(pid)
    (folder / "task" / str(pid)).mkdir(parents=True)
    after = ["S", "1", str(pid), str(pid), "0", "-1", "4194304", "0", "0", "0", "0"]
    after += [str(utime), str(stime), "99999", "99999", "20", "0", "1", "0", str(started)]
    after += ["123456", "789"]
    (folder / "stat").write_text(f"{pid} ({name}) {' '.join(after)}\n")
    (folder / "task" / str(pid) / "children").write_text("".join(f"{c} " for c in children))
    if pss_kib is not None:
        (folder / "smaps_rollup").write_text(
            f"00400000-7ffc [rollup]\nRss:  {pss_kib * 2 + pid} kB\nPss:  {pss_kib} kB\n"
        )
    if rss_kib is not None:
        (folder / "status").write_text(f"Name:\t{name}\nVmRSS:\t{rss_kib} kB\n")


def test_cpu_time_counts_each_process_once_by_id_and_start(tmp_path: Path) -> None:
    """Two snapshots: the command (100) and a step process (101, whose name has spaces and
    parentheses); then 101 has ended, its id is reused by a new process started later, and a
    PDF renderer (102) has appeared. Each process counts its own latest ticks, the ended one
    what it had when last seen, never the cumulative children's ticks: (80 + 30) + (20 + 5) +
    (3 + 1) + (6 + 0) = 145 ticks."""
    first, second = tmp_path / "first", tmp_path / "second"
    _process(first, 100, started=10, utime=50, stime=20, children=(101,), pss_kib=1)
    _process(first, 101, started=11, utime=20, stime=5, pss_kib=1, name="step (ingest) 1")
    _process(second, 100, started=10, utime=80, stime=30, children=(101, 102), pss_kib=1)
    _process(second, 101, started=40, utime=3, stime=1, pss_kib=1)
    _process(second, 102, started=41, utime=6, stime=0, pss_kib=1)
    account = CpuAccount()
    account.add(process_tree(100, first))
    assert account.seconds(ticks_per_s=100) == pytest.approx(0.95)
    account.add(process_tree(100, second))
    assert account.processes == 4
    assert account.seconds(ticks_per_s=100) == pytest.approx(1.45)


def test_memory_sums_the_tree_pss_else_rss(tmp_path: Path) -> None:
    """The tree's memory is its processes' proportional set sizes summed, a process whose
    smaps_rollup cannot be read counted by its resident size; a process outside the tree
    (200) is not counted."""
    proc = tmp_path / "proc"
    _process(proc, 100, started=1, utime=0, stime=0, children=(101,), pss_kib=4 * 2**20)
    _process(proc, 101, started=2, utime=0, stime=0, children=(102,), pss_kib=5 * 2**20)
    _process(proc, 102, started=3, utime=0, stime=0, rss_kib=6 * 2**20)
    _process(proc, 200, started=4, utime=0, stime=0, pss_kib=8 * 2**20)
    assert tree_memory_bytes(100, proc) == 15 * GIB
    assert tree_memory_bytes(101, proc) == 11 * GIB


def test_the_guard_stops_on_the_sum_not_on_any_one_process(tmp_path: Path) -> None:
    """Three processes of 4, 5 and 6 GiB are each under a 12 GiB limit, together over it;
    the wall-time limit applies on its own, and no limit means none."""
    proc = tmp_path / "proc"
    _process(proc, 100, started=1, utime=0, stime=0, children=(101, 102), pss_kib=4 * 2**20)
    _process(proc, 101, started=2, utime=0, stime=0, pss_kib=5 * 2**20)
    _process(proc, 102, started=3, utime=0, stime=0, pss_kib=6 * 2**20)
    limits = Limits(12 * GIB, wall_s=600)
    assert all(s.pss < limits.memory_bytes for s in process_tree(100, proc))
    assert limits.exceeded(1.0, tree_memory_bytes(100, proc)) == (
        "over the memory limit (12.0 GiB)"
    )
    assert limits.exceeded(1.0, 12 * GIB) is None  # at the limit is not over it
    assert limits.exceeded(601.0, GIB) == "over the wall-time limit (600 s)"
    crowded = Limits(12 * GIB, min_available_bytes=GIB)
    assert crowded.exceeded(1.0, 2 * GIB, available_bytes=GIB // 2) == (
        "the machine's available memory under 1.0 GiB (the run held 2.0 GiB)"
    )
    assert crowded.exceeded(1.0, 2 * GIB, available_bytes=2 * GIB) is None
    assert Limits(12 * GIB).exceeded(10**9, GIB) is None


def test_kill_tree_ends_the_command_and_its_descendants() -> None:
    """A shell that started two sleeps in the background, and they, are all gone after
    kill_tree of the shell alone."""
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    try:
        for _ in range(200):
            tree = process_tree(shell.pid)
            if len(tree) == 3:
                break
            subprocess.run(["sleep", "0.02"], check=True)
        assert len(tree) == 3
        kill_tree(shell.pid)
        assert shell.wait(timeout=10) == -9
        for sample in tree[1:]:  # the sleeps, reparented when the shell died, are gone
            for _ in range(200):
                if not Path(f"/proc/{sample.pid}").exists() or _zombie(sample.pid):
                    break
                subprocess.run(["sleep", "0.02"], check=True)
            assert not Path(f"/proc/{sample.pid}").exists() or _zombie(sample.pid)
    finally:
        if shell.poll() is None:
            shell.kill()
            shell.wait()


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def test_a_run_over_the_memory_limit_is_killed_and_said(tmp_path: Path) -> None:
    """A command that holds 200 MiB under a 64 MiB guard is killed (no exit of its own),
    and the reason is the memory limit; its samples are there and its CPU time counted."""
    hog = "b = b'x' * (200 * 2**20); import time; time.sleep(60)"
    watched = run_watched(
        [sys.executable, "-c", hog],
        tmp_path / "log",
        dict(os.environ),
        tmp_path,
        Limits(64 * 2**20, wall_s=120),
    )
    assert watched.code == -9
    assert watched.stopped == "over the memory limit (0.1 GiB)"
    assert watched.peak > 64 * 2**20
    assert watched.cpu_s > 0


def test_cpu_between_reads_the_cumulative_samples() -> None:
    """A stage's CPU is the cumulative figure at its end minus at its start (the last sample
    taken by each moment); before the first sample it is 0."""
    samples = [(10.0, 0, 1.0), (11.0, 0, 1.5), (12.0, 0, 3.0), (13.0, 0, 3.25)]
    moments = [t for t, _, _ in samples]
    assert cpu_between(samples, moments, 10.5, 12.5) == pytest.approx(2.0)
    assert cpu_between(samples, moments, 9.0, 11.0) == pytest.approx(1.5)
    assert cpu_between(samples, moments, 13.0, 20.0) == 0.0


def test_disk_bytes_counts_allocated_blocks_and_a_linked_file_once(tmp_path: Path) -> None:
    """Disk use is the files' allocated blocks; a file linked twice counts once; a missing
    folder is 0."""
    folder = tmp_path / "out"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(os.urandom(100_000))
    (folder / "sub" / "b.bin").write_bytes(os.urandom(50_000))
    os.link(folder / "a.bin", folder / "sub" / "a-again.bin")
    expected = sum((folder / name).stat().st_blocks * 512 for name in ("a.bin", "sub/b.bin"))
    assert expected >= 150_000
    assert disk_bytes(folder) == expected
    assert disk_bytes(folder / "a.bin") == (folder / "a.bin").stat().st_blocks * 512
    assert disk_bytes(tmp_path / "missing") == 0


def test_a_vfork_child_sharing_its_parents_memory_counts_once(tmp_path: Path) -> None:
    """A child showing exactly its parent's resident and proportional sizes (a ``vfork`` child
    before it runs its program: one memory seen through two processes) adds nothing; a child
    with the same PSS but its own resident size is counted."""
    proc = tmp_path / "proc"
    _process(proc, 100, started=1, utime=0, stime=0, children=(101, 102), pss_kib=2**20)
    _process(proc, 101, started=2, utime=0, stime=0, pss_kib=2**20)
    _process(proc, 102, started=3, utime=0, stime=0, pss_kib=2**20)
    rollup = (proc / "100" / "smaps_rollup").read_text()
    (proc / "101" / "smaps_rollup").write_text(rollup)  # the same memory, to the kB
    assert tree_memory_bytes(100, proc) == 2 * GIB
