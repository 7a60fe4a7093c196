"""The ``ray`` executor: a plain function (``SyncScorer``, ``SyncTrajectoryScorer``) in a pool of Ray
actors, each holding one copy of the scorer, placed by the cluster (``num_cpus``, ``actor_options``). It keeps
the rules of ``WorkerPool`` (the process executor's): chunks of ``PROCESS_CHUNK`` calls with one in flight per
actor, results one call at a time (a streaming generator), a deadline from the moment the actor starts the
call, an actor past it killed and replaced and the rest of its chunk resent, Ray's own retries off.

What Ray does not give for free, added here: an actor that dies fails exactly the call that killed it (the
calls of its chunk whose answers were lost are rerun one at a time on a new actor to find it); an actor the
cluster cannot place within ``placement_timeout`` is one error naming the resources asked for and those the
cluster has (never a silent wait); a scorer the actors cannot import or unpickle is one located error (no
restart loop); a close kills every actor it created and releases the connection, bounded.

The connection (``_CLUSTER``) is shared by every ray executor in the process: a driver that already called
``ray.init()`` is reused and never disconnected; otherwise the first executor joins ``ray_address`` (or
``RAY_ADDRESS``) within ``connect_timeout`` (nothing listening there fails at once; one that does not answer
as a Ray cluster fails when the time is up: Ray's own connection retries would wait minutes), or starts a
local cluster of this machine's CPUs (its own temp dir, dashboard off,
listening on 127.0.0.1 only, never an address found on record) with a watchdog process that ends it if the
driver dies without closing; the last executor to close disconnects (and stops the cluster it started).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import anyio

from prm_jax.runtime._executors import describe, starting
from prm_jax.runtime._process_pool import WorkerPool, _Call, _Unusable
from prm_jax.runtime._ray_watchdog import VARIABLE as OWNER_VARIABLE
from prm_jax.runtime._ray_watchdog import cluster_processes, end_cluster
from prm_jax.runtime._scoring import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_PLACEMENT_TIMEOUT_S,
    BaseScorer,
    usable_cores,
)
from prm_jax.runtime._worker import _GAVE_UP, ScorerActor

SHUTDOWN_S = 10.0  # the most a close waits for Ray to disconnect (and stop the local cluster it started)


def import_ray() -> Any:
    """``ray``, or an ``ImportError`` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError("executor 'ray' needs Ray: pip install 'prm-jax[ray]' (or pip install ray)") from None
    return ray


class _Connection:
    """This process's connection to a Ray cluster, shared by every ray executor; see the module docstring."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.ours: str | None = None  # "started" (a local cluster), "joined" (an address), None (the user's)
        self.address: str | None = None
        self.temp_dir: str | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.marker = ""

    def acquire(self, address: str | None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
        ray = import_ray()
        with self.lock:
            if self.users == 0 and not ray.is_initialized():
                address = address or os.environ.get("RAY_ADDRESS") or None
                if address:
                    join(ray, address, connect_timeout)
                    self.ours, self.address = "joined", address
                else:
                    self._start_local(ray)
            elif self.users == 0:
                self.ours, self.address = None, None  # the caller's own ray.init(): reused, never disconnected
            elif address and self.address and address not in (self.address, "auto"):
                raise ValueError(f"ray_address {address!r}: this process is already connected to the Ray cluster "
                                 f"at {self.address!r} (one cluster per process)")
            self.users += 1

    def _start_local(self, ray: Any) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="prm-jax-ray-")
        self.marker = uuid.uuid4().hex
        os.environ[OWNER_VARIABLE] = self.marker  # inherited by every process the cluster starts
        try:
            ray.init(address="local", num_cpus=usable_cores(), include_dashboard=False, _temp_dir=self.temp_dir,
                     _node_ip_address="127.0.0.1")
        except BaseException:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            raise
        finally:
            os.environ.pop(OWNER_VARIABLE, None)
        self.ours, self.address = "started", ray.get_runtime_context().gcs_address
        self.watchdog = subprocess.Popen(
            [sys.executable, "-m", "prm_jax.runtime._ray_watchdog", str(os.getpid()), self.marker, self.temp_dir],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users > 0 or self.ours is None:
                return
            ray = import_ray()
            known = cluster_processes(self.marker, {os.getpid()}) if self.ours == "started" else set()
            ray.shutdown()
            if self.ours == "started":
                end_cluster(self.marker, exclude={os.getpid()}, known=known)  # what Ray's shutdown left running
                if self.watchdog is not None:
                    self.watchdog.send_signal(signal.SIGTERM)
                    try:
                        self.watchdog.wait(5)
                    except subprocess.TimeoutExpired:
                        self.watchdog.kill()
                shutil.rmtree(self.temp_dir or "", ignore_errors=True)
            self.ours = self.address = self.temp_dir = None
            self.watchdog = None


_CLUSTER = _Connection()


def _host_port(address: str) -> tuple[str, int] | None:
    """The host and port an address names (``host:port``, ``ray://host:port``; ``ray://host`` is Ray Client's
    10001); ``None`` for ``auto`` and other forms Ray resolves itself."""
    rest = address.strip()
    client = rest.startswith("ray://")
    rest = rest.removeprefix("ray://")
    if rest in ("auto", "local", ""):
        return None
    host, _, port = rest.rpartition(":")
    if not host:
        return (rest, 10001) if client else None
    if not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def join(ray: Any, address: str, connect_timeout: float) -> None:
    """``ray.init(address=address)`` bounded by ``connect_timeout``: first a TCP connection to the address
    (nothing listening, a wrong host: one line at once), then Ray's own handshake in a thread waited for up to
    the rest of the time. ``ConnectionError`` naming the address and what to check."""
    started = time.monotonic()
    check = ("check that the cluster's head is running there (`ray status` on it), that the address and port "
             "are the GCS's (6379 by default; ray://host:10001 for Ray Client) and that no firewall is between; "
             f"connect_timeout ({connect_timeout:g} s) bounds the wait")
    target = _host_port(address)
    if target is not None:
        try:
            socket.create_connection(target, timeout=connect_timeout).close()
        except OSError as err:
            raise ConnectionError(f"ray_address {address!r}: cannot connect ({err.strerror or err}): {check}") from None
    done, abandoned = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def connect() -> None:
        try:
            ray.init(address=address)
            if abandoned.is_set():  # connected after the caller gave up: leave no connection behind
                ray.shutdown()
        except BaseException as err:  # (handed to the caller below)
            failure.append(err)
        finally:
            done.set()

    threading.Thread(target=connect, name="prm-jax-ray-connect", daemon=True).start()
    if not done.wait(max(0.0, connect_timeout - (time.monotonic() - started))):
        abandoned.set()
        raise ConnectionError(f"ray_address {address!r}: no Ray cluster answered within connect_timeout "
                              f"({connect_timeout:g} s): {check}")
    if failure:
        raise ConnectionError(f"ray_address {address!r}: {type(failure[0]).__name__}: {failure[0]}; {check}") from None


class _Actor:
    """One actor of the pool: its handle, and where it runs."""

    __slots__ = ("handle", "node", "pid")

    def __init__(self, handle: Any):
        self.handle, self.pid, self.node = handle, 0, ""


class RayExecutor(WorkerPool):
    """A plain function in a pool of Ray actors; see the module docstring and ``WorkerPool`` (the rules it
    keeps). ``max_workers`` actors (default: as many as the cluster's CPUs hold at ``num_cpus`` each)."""

    WORKERS = "Ray actors"

    def __init__(self, scorer: BaseScorer, method: str, timeout: float | None):
        super().__init__(scorer, method, timeout)
        self.address: str | None = getattr(scorer, "ray_address", None)
        self.num_cpus = float(getattr(scorer, "num_cpus", None) or 1.0)
        self.actor_options: dict[str, Any] = dict(getattr(scorer, "actor_options", None) or {})
        self.placement_timeout = float(getattr(scorer, "placement_timeout", None) or DEFAULT_PLACEMENT_TIMEOUT_S)
        self.connect_timeout = float(getattr(scorer, "connect_timeout", None) or DEFAULT_CONNECT_TIMEOUT_S)
        self._connected = False
        self._blob: bytes | None = None
        self._suspects: set[int] = set()  # calls whose actor died before answering: rerun one at a time
        self.nodes: set[str] = set()  # the nodes its actors were placed on
        self.shrunk = 0  # actors that could not be replaced (their calls went to the others)

    async def _start_workers(self) -> None:
        with starting(self.scorer.name):  # ray.init takes seconds: never on the event loop, and not lag to report
            await anyio.to_thread.run_sync(self._start)

    def _prepare(self) -> None:
        ray = import_ray()
        try:
            self._blob = ray.cloudpickle.dumps(self.scorer)
        except Exception as err:
            raise TypeError(f"scorer {self.scorer.name!r} runs with executor 'ray', so it is pickled into its "
                            f"actors, but it does not pickle: {err!r} (keep clients and locks out of its state, or "
                            "open them lazily in the actor)") from None
        if not self._connected:
            _CLUSTER.acquire(self.address, self.connect_timeout)
            self._connected = True
        total = ray.cluster_resources()
        asked = self.asked()
        short = {k: v for k, v in asked.items() if total.get(k, 0.0) < v}
        if short:
            raise _Unusable(f"its Ray actors ask for {asked} each, more than the cluster has in all "
                            f"({_resources(total)}): lower num_cpus or actor_options, or add nodes")
        if getattr(self.scorer, "max_workers", None) is None:
            self.workers = max(1, int(total.get("CPU", 1.0) // self.num_cpus))  # (num_cpus > 0: validated)
        self._remote = ray.remote(ScorerActor).options(
            num_cpus=self.num_cpus, max_restarts=0, max_task_retries=0, **self.actor_options)

    def asked(self) -> dict[str, float]:
        """The resources one actor asks for."""
        asked = {"CPU": self.num_cpus}
        if self.actor_options.get("num_gpus"):
            asked["GPU"] = float(self.actor_options["num_gpus"])
        asked.update({k: float(v) for k, v in (self.actor_options.get("resources") or {}).items()})
        return {k: v for k, v in asked.items() if v}

    def _new_worker(self, calls: list[_Call]) -> Any:
        with starting(self.scorer.name):  # (placing an actor runs Ray's Python in this thread: _start_workers)
            return super()._new_worker(calls)

    def _spawn(self) -> _Actor:
        ray = import_ray()
        actor = _Actor(self._remote.remote())
        placed = actor.handle.where.remote()
        ready, _ = ray.wait([placed], timeout=self.placement_timeout)
        if not ready:
            ray.kill(actor.handle, no_restart=True)
            total, free = ray.cluster_resources(), ray.available_resources()
            raise _Unusable(f"its Ray actor could not be placed within placement_timeout={self.placement_timeout} "
                            f"s: each actor asks for {self.asked()}; the cluster has {_resources(total)} in all and "
                            f"{_resources({k: free.get(k, 0.0) for k in total})} free now (free or add resources, "
                            "lower num_cpus or max_workers, or raise placement_timeout)")
        try:
            actor.pid, actor.node = ray.get(placed)
        except ray.exceptions.RayError as err:
            raise _Unusable(f"its Ray actor could not start: {_cause(err)} (is prm-jax installed where the "
                            "cluster runs its workers?)") from None
        self.nodes.add(actor.node)
        return actor

    def _shrink(self, calls: list[_Call]) -> bool:
        """An actor that cannot be placed while others run (a node left the cluster): its calls go to them
        and the pool shrinks by one; with none left, the placement error fails the scorer's calls."""
        with self._ready:
            if not self._live or self.closed:
                return False
            self._queue.extendleft(reversed(calls))
            self.workers = max(1, self.workers - 1)
            self._ready.notify_all()
        self.shrunk += 1
        return True

    def _loaded(self, worker: _Actor, calls: list[_Call]) -> str | None:
        ray = import_ray()
        try:
            why = ray.get(worker.handle.load.remote(self._blob))
        except ray.exceptions.RayError as err:
            return self._closed_why if self.closed else f"its Ray actor died while loading the scorer: {_cause(err)}"
        if why is not None:
            self._give_up(f"scorer {self.scorer.name!r}: {why}", calls)
            return _GAVE_UP
        return None

    def _chunk(self, worker: _Actor, calls: list[_Call]) -> tuple[list[_Call], bool]:
        ray = import_ray()
        alone = id(calls[0]) in self._suspects  # an actor died with it unanswered: it runs alone now
        sent = calls[:1] if alone else calls
        try:
            answers = worker.handle.run.options(num_returns="streaming").remote(self.method, [c.args for c in sent])
        except Exception as err:  # an argument that does not serialize fails this chunk's calls
            for call in sent:
                call.future.set_exception(TypeError(
                    f"scorer {self.scorer.name!r} on {describe(call.on)}: its arguments could not be sent to its Ray "
                    f"actor: {err!r}"))
            return calls[len(sent):], True
        for k, call in enumerate(sent):
            started = time.monotonic()
            ready, _ = ray.wait([answers], timeout=self.timeout)
            if not ready:
                self._suspects.discard(id(call))
                call.future.set_exception(TimeoutError(
                    f"scorer {self.scorer.name!r} on {describe(call.on)} took longer than its timeout of {self.timeout} s "
                    "in its Ray actor (the actor was killed and replaced)"))
                return calls[k + 1:], False
            try:
                payload = ray.get(next(answers))
            except ray.exceptions.RayError as err:
                lost = calls[k:]
                if alone or len(lost) == 1 or self.closed:
                    self._suspects.discard(id(call))
                    call.future.set_exception(RuntimeError(
                        f"scorer {self.scorer.name!r} on {describe(call.on)}: its Ray actor died after "
                        f"{time.monotonic() - started:.3f} s in this call: {_cause(err)}"))
                    return calls[k + 1:], False
                self._suspects.update(id(c) for c in lost)  # which of them killed it is not known: one at a time
                return lost, False
            self._suspects.discard(id(call))
            self._answer(call, payload)
        return calls[len(sent):], True

    def _kill(self, worker: _Actor) -> None:
        ray = import_ray()
        try:
            ray.kill(worker.handle, no_restart=True)
        except Exception:  # (already gone, or the connection is)
            pass

    async def _end_workers(self) -> None:
        await super()._end_workers()
        if self._connected:
            self._connected = False
            with anyio.move_on_after(SHUTDOWN_S):
                await anyio.to_thread.run_sync(_CLUSTER.release, abandon_on_cancel=True)


def _cause(err: BaseException) -> str:
    """A Ray error's cause in one line (Ray's messages run to many)."""
    text = " ".join(str(err).split())
    return text if len(text) <= 600 else text[:600] + " ..."


def _resources(resources: Mapping[str, float]) -> str:
    """A cluster's resources for messages (Ray's node-id and memory entries left out)."""
    shown = {k: round(v, 3) for k, v in sorted(resources.items())
             if not k.startswith("node:") and k not in ("memory", "object_store_memory")}
    return str(shown)
