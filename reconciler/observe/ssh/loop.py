"""One asyncio event loop in one thread, shared by every SSH connection of a pool.

The rest of the reconciler is synchronous: a caller hands the loop a coroutine and waits on
its result (run), or takes a concurrent Future it can wait on with others (submit). An idle
connection costs no thread and no wake-ups: its keepalive is a timer in this loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")

# How long closing the loop waits for connections still closing before it drops them.
CLOSE_WAIT_S = 2.0


class LoopClosed(RuntimeError):
    """The loop was closed while a caller waited on it (the pool is closing)."""


def _settle(future: concurrent.futures.Future, task: asyncio.Task) -> None:
    if task.cancelled():  # the loop is closing: the caller hears LoopClosed
        future.set_exception(concurrent.futures.CancelledError())
    elif task.exception() is not None:
        future.set_exception(task.exception())
    else:
        future.set_result(task.result())


class EventLoop:
    """Started on first use; closed by close(), and started afresh if used again after."""

    def __init__(self, name: str = "ssh-loop"):
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.generation = 0  # bumped per started loop: what was bound to an older one is gone
        self._incoming: list[tuple[Callable[[], None], Callable[[], None]]] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                # A daemon thread: a command stuck past every deadline never keeps the process from exiting.
                thread = threading.Thread(target=self._serve, args=(loop,), name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                self.generation += 1
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        loop.run_forever()
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=CLOSE_WAIT_S))
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        """coro scheduled in the loop; its result (or error) in the Future returned."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            if not future.set_running_or_notify_cancel():
                coro.close()
                return
            task = asyncio.get_running_loop().create_task(coro)
            task.add_done_callback(lambda done: _settle(future, done))

        def never_started() -> None:
            coro.close()
            if future.set_running_or_notify_cancel():
                future.set_exception(concurrent.futures.CancelledError())

        self._hand_over(start, never_started)
        return future

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run coro in the loop and wait for its result; the coroutine bounds its own time."""
        if self.in_loop():
            coro.close()
            raise RuntimeError("EventLoop.run called from the loop's own thread (it would wait on itself)")
        try:
            return self.submit(coro).result()
        except concurrent.futures.CancelledError:
            raise LoopClosed("the SSH event loop was closed") from None

    def call(self, fn: Callable[..., object], *args: object) -> None:
        """Run fn(*args) in the loop soon, without waiting (closing a channel from another thread);
        nothing if the loop is not running (what fn would close went with it)."""
        with self._lock:
            running = self._loop is not None
        if running:
            self._hand_over(lambda: fn(*args), lambda: None)

    def _hand_over(self, job: Callable[[], None], dropped: Callable[[], None]) -> None:
        # Jobs handed over while the loop has not yet taken the previous ones are taken with them:
        # a probe pass over thousands of nodes (or closing their connections) wakes the loop once,
        # not once per node.
        loop = self.loop
        with self._lock:
            self._incoming.append((job, dropped))
            wake = len(self._incoming) == 1
        if wake:
            try:
                loop.call_soon_threadsafe(self._take_incoming)
            except RuntimeError:  # closed as this was handed over
                self._drop_incoming()

    def _take_incoming(self) -> None:
        with self._lock:
            batch, self._incoming = self._incoming, []
        for job, _ in batch:
            job()

    def _drop_incoming(self) -> None:
        with self._lock:
            untaken, self._incoming = self._incoming, []
        for _, dropped in untaken:  # handed over as the loop stopped: never started
            dropped()

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join(timeout=CLOSE_WAIT_S + 5.0)
        self._drop_incoming()
