"""The hand-over to the delivery listeners (a server's event loop), where a request is rejected
on its caller's thread while the engine's owner tells the listeners."""

from __future__ import annotations

from multiseq.loop.delivery import Deliveries, RequestHandle


def test_a_rejection_is_told_even_when_the_owner_tells_while_its_callback_runs():
    """The owner's tell may come between the rejection's start and its on_finish handing the
    result over (the two run on different threads): the listeners still hear of it after."""
    deliveries = Deliveries()
    handed_over, seen_by_listener = [], []
    deliveries.add_listener(lambda: seen_by_listener.append(list(handed_over)))

    def on_finish(result) -> None:
        deliveries.tell()  # the owner's tell, landing right now
        handed_over.append(result.id)

    deliveries.reject(RequestHandle("r1", stream=False, on_finish=on_finish), "bad request")
    assert seen_by_listener and seen_by_listener[-1] == ["r1"], seen_by_listener
