"""Verification in worker processes, with a per-response timeout that kills and replaces a hung worker.

    parent (RewardFunction)                         worker k (forked)
    pending responses ──chunk──► conn_k ──► for each (index, response, label):
          ▲                                     scores = [v(response, label) for v in verifiers]
          └────────── one result per response ◄──┘   send (index, scores)
    deadline_k = last result from k (or chunk sent to idle k) + timeout
    past deadline_k: SIGKILL k, its current response scores 0 (counted), a fresh worker takes the rest

Why processes and not threads: math-verify is CPU-bound sympy (the GIL serialises threads) and
guards itself with ``signal.alarm``, which only works in a main thread; and a thread stuck in C
code cannot be stopped, while a process can be killed.

A worker runs its chunk's responses one after another and reports each, so the parent always
knows which response is running: the oldest unanswered one. Chunks are only sent to an idle worker
(blocked in ``recv``), so the parent never blocks on a full pipe behind a hung worker.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

ScoreFn = Callable[[str, str], float]
# Seconds a worker waits in recv before checking that its parent is still alive: an orphaned
# worker (parent SIGKILLed, e.g. a Ray actor torn down) exits instead of lingering.
_ORPHAN_CHECK_S = 1.0
_MAX_CHUNK = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolScores:
    scores: np.ndarray
    """``[num_responses, num_verifiers]`` raw scores; rows of timed-out responses are 0."""
    timed_out: np.ndarray
    """``[num_responses]`` bool: the response exceeded the timeout and its worker was replaced."""


class VerifierError(RuntimeError):
    """A verifier raised inside a worker; the message carries the worker-side traceback."""


def _worker_main(conn: Connection, verifiers: tuple[ScoreFn, ...], parent_pid: int) -> None:
    while True:
        while not conn.poll(_ORPHAN_CHECK_S):
            if os.getppid() != parent_pid:
                return
        for index, response, label in conn.recv():
            try:
                scores = tuple(float(v(response, label)) for v in verifiers)
            except Exception:  # reported to the parent, which raises it there
                conn.send((index, None, traceback.format_exc()))
                continue
            conn.send((index, scores, None))


@dataclass(slots=True)
class _Worker:
    process: Any
    conn: Connection
    outstanding: deque[int] = field(default_factory=deque)
    last_progress: float = 0.0


class VerifierPool:
    """``num_workers`` forked processes scoring (response, label) pairs with fixed verifiers.

    Workers start on the first ``score`` call and live until ``close`` (or garbage collection).
    Fork (not spawn) so verifiers registered at run time, lambdas included, reach the workers
    without pickling, and a replacement starts in milliseconds.
    """

    def __init__(
        self,
        verifiers: Sequence[ScoreFn],
        *,
        num_workers: int,
        timeout: float,
        warm_ups: Sequence[Callable[[], object]] = (),
    ) -> None:
        """``warm_ups`` run once in this process before the first fork: imports and caches they
        load are inherited by every worker, so a fresh worker (also a replacement) answers at full
        speed instead of spending its first response's timeout on imports (math-verify: ~0.9 s)."""
        if num_workers < 1:
            raise ValueError(f"verifier_parallel={num_workers}; use 1 or more worker processes")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"verifier_timeout={timeout}; use a positive number of seconds")
        self._verifiers = tuple(verifiers)
        self._num_workers = num_workers
        self._timeout = float(timeout)
        self._context = multiprocessing.get_context("fork")
        self._warm_ups = tuple(warm_ups)
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)

    def score(self, pairs: Sequence[tuple[str, str]]) -> PoolScores:
        scores = np.zeros((len(pairs), len(self._verifiers)), dtype=np.float64)
        timed_out = np.zeros(len(pairs), dtype=bool)
        if not pairs:
            return PoolScores(scores=scores, timed_out=timed_out)
        self._start_workers()
        pending: deque[int] = deque(range(len(pairs)))
        try:
            while pending or any(w.outstanding for w in self._workers):
                self._feed_idle(pending, pairs)
                self._collect(scores, timed_out, pending)
        except BaseException:
            # Results of this call may still be in flight; a fresh set of workers keeps later
            # calls from reading them.
            _kill_all(self._workers)
            raise
        return PoolScores(scores=scores, timed_out=timed_out)

    def close(self) -> None:
        # Workers hold no state worth a graceful exit; killing is immediate even mid-verification.
        _kill_all(self._workers)

    def _start_workers(self) -> None:
        for warm_up in self._warm_ups:
            warm_up()
        self._warm_ups = ()
        while len(self._workers) < self._num_workers:
            self._workers.append(self._spawn())

    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_worker_main,
            args=(child_conn, self._verifiers, os.getpid()),
            daemon=True,
            name="verifier",
        )
        process.start()
        child_conn.close()
        return _Worker(process=process, conn=parent_conn)

    def _feed_idle(self, pending: deque[int], pairs: Sequence[tuple[str, str]]) -> None:
        for worker in self._workers:
            if worker.outstanding or not pending:
                continue
            # Guided self-scheduling: big chunks while much is left, single items at the end, so
            # one slow response does not leave the other workers idle behind a long chunk.
            size = max(1, min(_MAX_CHUNK, len(pending) // (2 * self._num_workers)))
            indices = [pending.popleft() for _ in range(min(size, len(pending)))]
            worker.conn.send([(i, *pairs[i]) for i in indices])
            worker.outstanding.extend(indices)
            worker.last_progress = time.monotonic()

    def _collect(self, scores: np.ndarray, timed_out: np.ndarray, pending: deque[int]) -> None:
        busy = [w for w in self._workers if w.outstanding]
        now = time.monotonic()
        wait_s = max(0.0, min(w.last_progress + self._timeout for w in busy) - now)
        ready = wait([w.conn for w in busy], timeout=wait_s)
        for worker in busy:
            if worker.conn in ready:
                self._receive(worker, scores)
            elif time.monotonic() >= worker.last_progress + self._timeout:
                self._replace_hung(worker, timed_out, pending)

    def _receive(self, worker: _Worker, scores: np.ndarray) -> None:
        # Drain everything already sent: one wakeup per result would cost a syscall round each.
        while worker.outstanding and worker.conn.poll(0):
            try:
                index, row, error = worker.conn.recv()
            except EOFError as exc:
                raise VerifierError(
                    f"a verifier worker (pid {worker.process.pid}) died while scoring response "
                    f"{worker.outstanding[0]}; see its stderr above"
                ) from exc
            if error is not None:
                raise VerifierError(f"a verifier raised on response {index}:\n{error}")
            assert index == worker.outstanding[0], "a worker answers its chunk in order"
            worker.outstanding.popleft()
            scores[index] = row
            worker.last_progress = time.monotonic()

    def _replace_hung(self, worker: _Worker, timed_out: np.ndarray, pending: deque[int]) -> None:
        hung = worker.outstanding.popleft()
        timed_out[hung] = True
        logger.warning(
            "verification of response %d exceeded %.3g s; it scores 0 and worker %d is replaced",
            hung,
            self._timeout,
            worker.process.pid,
        )
        pending.extendleft(reversed(worker.outstanding))
        _kill(worker)
        self._workers[self._workers.index(worker)] = self._spawn()


def _kill(worker: _Worker) -> None:
    if worker.process.is_alive():
        worker.process.kill()
    worker.process.join(timeout=5.0)
    worker.conn.close()


def _kill_all(workers: list[_Worker]) -> None:
    for worker in workers:
        _kill(worker)
    workers.clear()
