"""One call run in a forked child while the caller goes on: the two halves of a search
on the two cores a planning machine has, without importing torch (`workers` pools import
it to set each worker's threads; the analytic search must not). `BothEnds` shares a list
of work between the two: each takes items from its own end until they meet."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import struct
from typing import Callable, TypeVar

T = TypeVar("T")


def start_forked(function: Callable[..., T], *args: object) -> Callable[[], T]:
    """Start `function(*args)` in a forked child, and return what waits for its result
    (raising what it raised). Where there is one core or no fork, the call runs here, now."""
    if (os.cpu_count() or 1) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        result = function(*args)
        return lambda: result
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, then leave without any cleanup
        os.close(read)
        try:
            try:
                payload = pickle.dumps((True, function(*args)))
            except BaseException as error:  # noqa: BLE001 - the parent raises it
                payload = pickle.dumps((False, error))
            with os.fdopen(write, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(0)
    os.close(write)

    def result() -> T:
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        os.waitpid(pid, 0)
        if not data:
            raise RuntimeError("the forked half of the search ended without an answer")
        ok, value = pickle.loads(data)
        if not ok:
            raise value
        return value

    return result


class BothEnds:
    """Indices 0..count-1 handed out once each, from the front to one process and from the
    back to the other, in memory a forked child shares: whichever half finishes its other
    work first takes more of the list, so neither waits on a split fixed in advance."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._lock = multiprocessing.Lock()
        self._ends = mmap.mmap(-1, 8)  # anonymous and shared: (next front, next back + 1)
        self._ends[:] = struct.pack("ii", 0, count)

    def front(self) -> int | None:
        """The next index from the front, or None when the list is used up."""
        return self._take(from_front=True)

    def back(self) -> int | None:
        """The next index from the back, or None when the list is used up."""
        return self._take(from_front=False)

    def taken(self) -> int:
        """How many indices either end has taken."""
        front, back = struct.unpack("ii", self._ends[:])
        return front + self.count - back

    def _take(self, from_front: bool) -> int | None:
        with self._lock:
            front, back = struct.unpack("ii", self._ends[:])
            if front >= back:
                return None
            index = front if from_front else back - 1
            self._ends[:] = struct.pack("ii", front + from_front, back - (not from_front))
            return index
