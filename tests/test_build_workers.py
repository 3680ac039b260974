"""Build pool workers end with the process that started the build (issue 12, item 5)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process semantics")

_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context
    from ck_core import build

    def work(path):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)

    if __name__ == "__main__":
        ctx = get_context("forkserver")
        with ProcessPoolExecutor(2, mp_context=ctx, initializer=build._die_with,
                                 initargs=(os.getpid(),)) as pool:
            futs = [pool.submit(work, os.path.join(sys.argv[1], f"w{i}")) for i in range(2)]
            time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def test_workers_die_with_a_killed_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(tmp_path.glob("w*"))) < 2:
            time.sleep(0.1)
        pids = [int(p.read_text() or 0) for p in tmp_path.glob("w*")]
        assert len(pids) == 2 and all(pids), "the workers did not start"
        assert all(_alive(p) for p in pids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} outlived their killed parent"
