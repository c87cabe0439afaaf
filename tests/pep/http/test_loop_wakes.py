"""Streams woken together (a micro-batch's rows into a thousand buffers) are handed to the event
loop a chunk per turn, so that what else the loop serves is read between chunks."""
import asyncio
import threading

from pep.http.streaming import FLUSH_CHUNK, _Waker


def test_many_wakes_leave_turns_of_the_loop_to_other_work() -> None:
    n = 5 * FLUSH_CHUNK + 3
    seen: list[int] = []

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        wakers = [_Waker(loop) for _ in range(n)]

        def deliver() -> None:  # a micro-batch's thread: every buffer, then another callback
            for w in wakers:
                w.wake()
            loop.call_soon_threadsafe(lambda: seen.append(sum(w.event.is_set() for w in wakers)))
        t = threading.Thread(target=deliver)
        t.start()
        t.join(10)  # blocks the loop: every wake and the callback are queued before it turns
        for _ in range(4 * n):
            if all(w.event.is_set() for w in wakers):
                break
            await asyncio.sleep(0)
        return [w.event.is_set() for w in wakers].count(True)
    woken = asyncio.run(main())
    assert woken == n  # every stream was woken in the end
    assert seen == [FLUSH_CHUNK]  # the other callback ran after the first chunk, not after all


def test_a_stream_woken_again_before_its_turn_is_woken_once() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        w = _Waker(loop)
        w.wake()
        w.wake()  # still pending: not queued twice
        assert len(w.wakes.pending) == 1
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return int(w.event.is_set())
    assert asyncio.run(main()) == 1
