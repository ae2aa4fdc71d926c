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


class EventLoop:
    """Started on first use; closed by close(), and started afresh if used again after."""

    def __init__(self, name: str = "ssh-loop"):
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.generation = 0  # bumped per started loop: what was bound to an older one is gone

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
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

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
        """Run fn(*args) in the loop soon, without waiting (closing a channel from another thread)."""
        with self._lock:
            loop = self._loop
        if loop is None:
            return
        if self.in_loop():
            fn(*args)
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # closed meanwhile: what fn would close went with it
            pass

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join(timeout=CLOSE_WAIT_S + 5.0)
