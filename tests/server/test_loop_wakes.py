"""Streams woken together (a micro-batch's rows into a thousand buffers) are handed to the event
loop a chunk per turn, so that what else the loop serves is read between chunks."""
import asyncio
import threading

from server.streaming import FLUSH_CHUNK, _Waker


def test_many_wakes_leave_turns_of_the_loop_to_other_work() -> None:
    n = 5 * FLUSH_CHUNK + 3
    seen: list[int] = []

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        wakers = [_Waker(loop) for _ in range(n)]

        def deliver() -> None:  # a micro-batch's thread: every buffer, then another callback
            for w in wakers:
                w.wake()
            loop.call_soon_threadsafe(lambda: seen.append(sum(w.is_set() for w in wakers)))
        t = threading.Thread(target=deliver)
        t.start()
        t.join(10)  # blocks the loop: every wake and the callback are queued before it turns
        for _ in range(4 * n):
            if all(w.is_set() for w in wakers):
                break
            await asyncio.sleep(0)
        return [w.is_set() for w in wakers].count(True)
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
        return int(w.is_set())
    assert asyncio.run(main()) == 1


def test_a_final_event_is_woken_ahead_of_the_streams_queued_before_it() -> None:
    from pep.core.rows import RowBatch
    from pep.handles.buffer import HandleBuffer
    from server.streaming import WakeCallback

    n = 3 * FLUSH_CHUNK
    order: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        rows = [_Waker(loop) for _ in range(n)]
        revoked = _Waker(loop)
        buffer = HandleBuffer()
        buffer.add_waiter(WakeCallback(revoked))  # as drive() registers a handle stream
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        revoked.clear()

        def deliver_then_revoke() -> None:
            for w in rows:  # a micro-batch's rows to every other stream
                w.wake()
            buffer.put(RowBatch(("{}",), 2))  # and to this one ...
            buffer.close("revoked", "policy deleted")  # ... which is revoked meanwhile
        t = threading.Thread(target=deliver_then_revoke)
        t.start()
        t.join(10)
        for _ in range(4 * n):
            if revoked.is_set() and not order:
                order.append(f"revoked after {sum(w.is_set() for w in rows)} others")
            if all(w.is_set() for w in rows):
                break
            await asyncio.sleep(0)
    asyncio.run(main())
    # the first chunk ran before the close queued it; then it came first, not after all the rest
    assert order and int(order[0].split()[2]) <= FLUSH_CHUNK, order


def test_a_waiter_without_urgent_is_called_for_the_final_event_too() -> None:
    from pep.handles.buffer import HandleBuffer

    calls: list[int] = []
    buffer = HandleBuffer()
    buffer.add_waiter(lambda: calls.append(1))
    buffer.close("revoked", "gone")
    assert calls == [1, 1]  # once when added, once for the final event


def test_final_events_are_all_woken_in_one_turn() -> None:
    """A revocation's thousands of `revoked` events are not spread over turns of the loop: with
    other threads busy, each turn's poll gave the interpreter lock away and waited up to 5 ms
    for it back (5,000 readers' p99 0.94-1.1 s, 0.76-0.83 s woken in one turn)."""
    n = 5 * FLUSH_CHUNK + 3
    seen: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        finals = [_Waker(loop) for _ in range(n)]
        rows = [_Waker(loop) for _ in range(n)]

        def revoke() -> None:
            for w in rows:
                w.wake()
            for w in finals:
                w.wake_first()
            loop.call_soon_threadsafe(lambda: seen.append(sum(w.is_set() for w in finals)))
        t = threading.Thread(target=revoke)
        t.start()
        t.join(10)
        for _ in range(4 * n):
            if all(w.is_set() for w in rows):
                break
            await asyncio.sleep(0)
        seen.append(sum(w.is_set() for w in rows))
    asyncio.run(main())
    assert seen == [n, n]  # every final in the first turn; the rows' streams after, in chunks
