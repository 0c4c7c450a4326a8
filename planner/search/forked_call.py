"""One call run in a forked child while the caller goes on: the two halves of a search
on the two cores a planning machine has, without importing torch (`workers` pools import
it to set each worker's threads; the analytic search must not)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
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
