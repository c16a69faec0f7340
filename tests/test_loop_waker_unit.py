"""The serving loop's waker (multiseq.server.waker): wake-ups from the engine's thread run the
callback on the loop, those that come before the loop gets to them run it once, and closing it,
on the loop or from another thread, gives its pipe back."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from multiseq.server.waker import LoopWaker

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files in /proc")


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_wake_ups_from_another_thread_run_the_callback_on_the_loop_once():
    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        called_on_the_loop, done = [], asyncio.Event()

        def callback() -> None:
            called_on_the_loop.append(threading.current_thread() is threading.main_thread())
            done.set()

        waker = LoopWaker(loop, callback)
        engine = threading.Thread(target=lambda: [waker.wake() for _ in range(5)])
        engine.start()
        engine.join()  # the loop waits here: all five wake-ups come before it looks
        await asyncio.wait_for(done.wait(), 5)
        await asyncio.sleep(0.05)
        waker.close()
        return called_on_the_loop

    assert asyncio.run(main()) == [True]


@pytest.mark.parametrize("closed_from", ["the loop", "another thread"])
def test_closing_gives_the_pipe_back_and_refuses_later_wake_ups(closed_from):
    async def main() -> None:
        before = open_files()
        waker = LoopWaker(asyncio.get_running_loop(), lambda: None)
        assert open_files() == before + 2
        if closed_from == "the loop":
            waker.close()
        else:
            closer = threading.Thread(target=waker.close)
            closer.start()
            closer.join()
            await asyncio.sleep(0.01)  # the loop gives it back when it gets to it
        assert open_files() == before
        with pytest.raises(RuntimeError):
            waker.wake()

    asyncio.run(main())
