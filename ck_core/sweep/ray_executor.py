"""The Ray executor: compile tasks over the cluster's CPUs, one benchmark actor per GPU.

Each kernel compiles as a Ray task (one CPU); as each finishes, its
benchmark tasks go to the actors (``num_gpus=1``; one CPU actor when the
cluster has no GPU).  One task is in flight per actor, so a task that passes
the timeout is that actor's alone: the actor is killed, the row says
``timeout`` and a fresh actor takes its place.  Rows stream back to the driver
and are written as they arrive, so ``--resume`` works as locally.

Ray is the optional extra ``ck-core[ray]``; it is imported only here.
"""
from __future__ import annotations

import collections
import importlib.util
import ipaddress
import logging
import re
import socket
import time
from typing import Optional

from .. import build as _build
from ..errors import CkError, ConfigError
from .work import Work, rates, timeout_row
from .work import release as release_tasks
from .local import STARTUP_S

log = logging.getLogger(__name__)


def require_ray():
    if importlib.util.find_spec("ray") is None:
        raise CkError("--executor ray needs Ray, which is not installed: pip install 'ck-core[ray]' "
                      "(or use the default --executor local)")
    import ray

    return ray


#: seconds to wait for a Ray cluster's port to answer before giving up
CONNECT_TIMEOUT_S = 4.0
_HOST = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_FORMS = "HOST:PORT (the head node's GCS port, e.g. 10.0.0.5:6379), ray://HOST:PORT (Ray Client) or auto"


def parse_address(address: str) -> Optional[tuple]:
    """``(host, port)`` of a Ray address to probe, None for ``auto`` / ``local`` (Ray finds the
    cluster itself); ConfigError for anything that is not an address."""
    def bad(why):
        return ConfigError(f"--address {str(address)[:80]!r} is not a Ray address ({why}); use {_FORMS}")

    if not isinstance(address, str) or not address.strip():
        raise bad("empty")
    text = address.strip()
    if text in ("auto", "local"):
        return None
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme != "ray":
            raise bad(f"scheme {scheme[:20]!r}; the only one is ray://")
    if text.startswith("["):          # [IPv6]:PORT
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise bad("an IPv6 host is written [ADDR]:PORT")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad(f"{host[:60]!r} is not an IPv6 address") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise bad("no port")
        if not _HOST.fullmatch(host):
            raise bad(f"{host[:60]!r} is not a host name or IP address")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise bad(f"port {port[:20]!r} is not a number in 1..65535")
    return host, int(port)


#: an HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, the Ray Client
#: server) answers with a SETTINGS frame of its own
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast, with a CkError, when no Ray cluster answers at the address: nothing listens, or
    what listens does not speak gRPC (Ray itself retries for minutes in both cases)."""
    hp = parse_address(address)
    if hp is None:
        return
    host, port = hp
    fix = (f"start one there (`ray start --head --port={port}`), fix --address, or drop --address to "
           f"start a local Ray instance")
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except OSError as exc:
        if isinstance(exc, socket.timeout) and "head" in locals():
            raise CkError(f"something listens at {address} but does not answer as a Ray cluster (no gRPC reply "
                          f"within {timeout:g} s): {fix}") from None
        why = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        raise CkError(f"cannot reach a Ray cluster at {address} ({why} within {timeout:g} s): {fix}") from None
    if len(head) < 9 or head[3] != 0x04:
        raise CkError(f"what listens at {address} is not a Ray cluster (it does not speak gRPC): {fix}")


class _BenchActor:
    """Wraps a BenchWorker; Ray pins it to its GPU (CUDA_VISIBLE_DEVICES)."""

    def __init__(self, kwargs: dict):
        from .worker import BenchWorker

        self.worker = BenchWorker(**kwargs)

    def run(self, task: dict) -> dict:
        return self.worker.run(task)


class RayExecutor:
    name = "ray"

    def __init__(self, address: Optional[str] = None, init: Optional[dict] = None):
        if address is not None:
            parse_address(address)   # a malformed address fails before Ray is even imported
        self.ray = require_ray()
        self.address = address
        self.init = dict(init or {})

    def _connect(self, env: dict):
        ray = self.ray
        if ray.is_initialized():
            return False
        kw = {"include_dashboard": False, "log_to_driver": False, "ignore_reinit_error": True,
              "runtime_env": {"env_vars": env}}
        kw.update(self.init)
        if self.address:
            probe(self.address)
            kw["address"] = self.address.strip()
        try:
            ray.init(**kw)
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
            raise CkError(f"could not start or join {where}: {str(exc)[:300]}; check --address, or use "
                          f"--executor local") from None
        return True

    def run(self, work: Work, emit, compiled_cb) -> dict:
        ray = self.ray
        env = _build._forwarded_env()
        started = self._connect(env)
        try:
            return self._run(work, emit, compiled_cb, env)
        finally:
            if started:
                ray.shutdown()

    def _run(self, work: Work, emit, compiled_cb, env) -> dict:
        ray = self.ray
        kwargs = dict(work.worker, env=env)
        compile_task = ray.remote(num_cpus=1, max_retries=0)(_build._compile_one)
        todo = [d for d in work.keys if d["name"] in work.compiles]
        c0 = time.perf_counter() if todo else None
        crefs = {compile_task.remote(d, None, False, env): d["name"] for d in todo}
        n_tasks = sum(len(t) for t in work.tasks.values())
        gpus = int(ray.cluster_resources().get("GPU", 0)) if work.worker["backend"] != "numpy" else 0
        actor_cls = ray.remote(num_gpus=1 if gpus else 0, num_cpus=0, max_restarts=0)(_BenchActor)
        n_actors = 0 if work.compile_only or not n_tasks else max(1, gpus)
        fresh: set = set()   # actors still to run their first task: set-up is not the task's time

        def new_actor():
            a = actor_cls.remote(kwargs)
            fresh.add(a)
            return a

        idle = [new_actor() for _ in range(n_actors)]
        queue: collections.deque = collections.deque()
        inflight: dict = {}   # ref -> (actor, task, deadline)
        n_compiled = hits = 0
        c1 = b0 = b1 = None
        pending_rows = done_rows = 0

        def release(name, meta, err):
            nonlocal pending_rows
            pending_rows += release_tasks(work, name, meta, err, emit, queue.append)

        for d in work.keys:
            if d["name"] not in work.compiles:
                release(d["name"], {}, None)
        while crefs or pending_rows:
            while queue and idle:
                actor, task = idle.pop(), queue.popleft()
                if b0 is None:
                    b0 = time.perf_counter()
                ref = actor.run.remote({k: v for k, v in task.items() if k != "base"})
                grace = STARTUP_S if actor in fresh else 0.0
                fresh.discard(actor)
                inflight[ref] = (actor, task, time.monotonic() + work.timeout + grace)
            waiting = list(crefs) + list(inflight)
            wait_s = min([0.5] + [max(0.0, d - time.monotonic()) for _, _, d in inflight.values()])
            done, _ = ray.wait(waiting, num_returns=1, timeout=wait_s) if waiting else ([], [])
            for ref in done:
                if ref in crefs:
                    name = crefs.pop(ref)
                    try:
                        _, meta, err = ray.get(ref)
                    except Exception as exc:  # a worker lost mid-compile: this kernel's failure
                        meta, err = None, f"{type(exc).__name__}: {exc}"
                    if err is None:
                        n_compiled += 1
                        hits += bool((meta or {}).get("cache_hit"))
                    compiled_cb(name, err is None)
                    if not crefs:
                        c1 = time.perf_counter()
                    release(name, meta, err)
                else:
                    actor, task, deadline = inflight.pop(ref)
                    try:
                        row = dict(task["base"], **ray.get(ref))
                        if time.monotonic() > deadline:   # answered, but later than the limit
                            row = timeout_row(task, work.timeout)
                        idle.append(actor)
                    except Exception as exc:  # the actor died: its row says so, a new actor replaces it
                        row = dict(task["base"], status="error", error=f"benchmark actor died: {exc}"[:500])
                        idle.append(new_actor())
                    pending_rows -= 1
                    done_rows += 1
                    emit(row)
                    b1 = time.perf_counter()
            now = time.monotonic()
            for ref, (actor, task, deadline) in list(inflight.items()):
                if now > deadline:
                    inflight.pop(ref)
                    ray.kill(actor)
                    idle.append(new_actor())
                    pending_rows -= 1
                    emit(timeout_row(task, work.timeout))
                    b1 = time.perf_counter()
        for actor in idle:
            ray.kill(actor)
        return dict(rates(n_compiled, hits, c0, c1, b0, b1, done_rows), bench_workers=n_actors, gpus=gpus,
                    ray_nodes=len(ray.nodes()), ray_cpus=ray.cluster_resources().get("CPU", 0))
