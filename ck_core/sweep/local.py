"""The local executor: the build pool compiles, one worker process per GPU benchmarks.

Compilation reuses the registry build's process pool (forked from a preloaded
server) and its per-kernel entry point; as each kernel finishes, its tasks go
to the benchmark queue.  Each benchmark worker is a spawned process pinned to
one GPU (``CUDA_VISIBLE_DEVICES``) running :class:`~.worker.BenchWorker`; a
task that gives no answer within the timeout kills the process (the row says
``timeout``) and the next task starts a fresh one.
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from typing import Optional

from .. import knobs
from .. import build as _build
from .work import Work, rates, timeout_row
from .work import release as release_tasks

log = logging.getLogger(__name__)

#: seconds a benchmark process may take to import and set up before its first task
STARTUP_S = 300


def gpu_count(backend: str) -> int:
    """Visible GPUs for benchmark workers (0: one CPU worker)."""
    if backend == "numpy" or knobs.interpreting():
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _ignore_sigint() -> None:
    # Ctrl-C reaches the whole process group: the parent decides, and stops its workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _worker_main(conn, kwargs: dict, device: Optional[int]) -> None:
    _ignore_sigint()
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(device)
    from .worker import BenchWorker

    try:
        worker = BenchWorker(**kwargs)
    except Exception as exc:  # reported on every task: the worker cannot start
        err = f"benchmark worker failed to start: {type(exc).__name__}: {exc}"
        conn.send("ready")
        while True:
            try:
                conn.recv()
            except EOFError:
                return
            conn.send({"status": "error", "error": err[:500]})
    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        conn.send(worker.run(task))


class _WorkerProcess:
    """A benchmark process on one device, restarted after a timeout or a crash."""

    def __init__(self, kwargs: dict, device: Optional[int]):
        self.kwargs, self.device = kwargs, device
        self.proc = self.conn = None

    def _start(self):
        ctx = get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, self.kwargs, self.device), daemon=True)
        self.proc.start()
        child.close()
        # imports and device set-up are not the first task's time
        if not self.conn.poll(STARTUP_S) or self.conn.recv() != "ready":
            raise OSError(f"the benchmark worker did not start within {STARTUP_S} s")

    def run(self, task: dict, timeout: float) -> dict:
        payload = {k: v for k, v in task.items() if k != "base"}
        try:
            if self.proc is None or not self.proc.is_alive():
                self._start()
            self.conn.send(payload)
            if self.conn.poll(timeout):
                return dict(task["base"], **self.conn.recv())
        except (EOFError, OSError) as exc:
            self.stop()
            return dict(task["base"], status="error", error=f"benchmark worker died: {exc}")
        self.stop()
        return timeout_row(task, timeout)

    def stop(self):
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
        self.proc = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class LocalExecutor:
    name = "local"
    stats: dict = {}

    def run(self, work: Work, emit, compiled_cb) -> dict:
        env = _build._forwarded_env()
        kwargs = dict(work.worker, env=env)
        results: "queue.Queue" = queue.Queue()
        bench_q: "queue.Queue" = queue.Queue()
        ngpu = gpu_count(work.worker["backend"])
        devices = list(range(ngpu)) or [None]
        n_tasks = sum(len(t) for t in work.tasks.values())
        clock = {"b0": None, "b1": None}
        stop = threading.Event()

        def bench_loop(device):
            proc = _WorkerProcess(kwargs, device)
            try:
                while True:
                    task = bench_q.get()
                    if task is None or stop.is_set():
                        return
                    if clock["b0"] is None:
                        clock["b0"] = time.perf_counter()
                    results.put(("row", proc.run(task, work.timeout)))
            finally:
                proc.stop()

        threads = []
        if not work.compile_only and n_tasks:
            threads = [threading.Thread(target=bench_loop, args=(d,), daemon=True) for d in devices]
            for t in threads:
                t.start()

        todo = [d for d in work.keys if d["name"] in work.compiles]
        ready = [d for d in work.keys if d["name"] not in work.compiles]
        c0 = time.perf_counter() if todo else None
        pool = None
        if todo:
            nw = max(1, min(work.workers, len(todo)))
            if nw == 1:
                pool = ThreadPoolExecutor(1)
            else:
                keys = [_key(d) for d in todo[:1]]
                pool = ProcessPoolExecutor(max_workers=nw, mp_context=_build._pool_context(keys),
                                           initializer=_ignore_sigint)
            for d in todo:
                fut = pool.submit(_build._compile_one, d, None, False, env)
                fut.add_done_callback(lambda f, n=d["name"]: results.put(("compiled", n, f)))
        pending_compiles = len(todo)
        pending_rows = done_rows = 0
        n_compiled = hits = 0
        c1 = None

        def release(name, meta, err):
            nonlocal pending_rows
            pending_rows += release_tasks(work, name, meta, err, emit, bench_q.put)

        interrupted = threading.Event()
        old_handler = None
        if threading.current_thread() is threading.main_thread():
            # a flag, not an exception: KeyboardInterrupt inside Queue.get breaks its lock
            old_handler = signal.signal(signal.SIGINT, lambda *a: interrupted.set())
        try:
            for d in ready:
                release(d["name"], {}, None)
            while pending_compiles or pending_rows:
                try:
                    msg = results.get(timeout=0.2)
                except queue.Empty:
                    if interrupted.is_set():
                        raise KeyboardInterrupt from None
                    continue
                if msg[0] == "row":
                    pending_rows -= 1
                    done_rows += 1
                    emit(msg[1])
                    clock["b1"] = time.perf_counter()
                    continue
                _, name, fut = msg
                pending_compiles -= 1
                try:
                    _, meta, err = fut.result()
                except Exception as exc:  # the pool itself broke: this kernel's failure
                    meta, err = None, f"{type(exc).__name__}: {exc}"
                if err is None:
                    n_compiled += 1
                    hits += bool((meta or {}).get("cache_hit"))
                compiled_cb(name, err is None)
                if not pending_compiles:
                    c1 = time.perf_counter()
                release(name, meta, err)
        finally:
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
            self.stats = dict(rates(n_compiled, hits, c0, c1, clock["b0"], clock["b1"], done_rows),
                              bench_workers=len(threads), gpus=ngpu)
            stop.set()
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
                os.environ.pop("CK_BUILD_WARM_KEY", None)
            for _ in threads:
                bench_q.put(None)
            for t in threads:
                t.join(30)
        return self.stats


def _key(d: dict):
    from ..key import KernelKey

    return KernelKey.from_dict(d)
