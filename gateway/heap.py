"""The garbage collector in a served gateway process.

After startup the heap holds some 100,000 long-lived objects (modules, the app, settings, pools).
Left to the defaults, every full collection walks them all (0.1-0.3 s, a pause in every request in
flight) and the young generation is collected every 700 allocations, about once per request.
``settle_heap`` moves what startup built out of the collector's sight (``gc.freeze``) and collects
the young generation less often: objects a request makes are freed by reference counting as it
ends; the collector is only needed for the few cycles (exceptions, some coroutines).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # allocations between collections of the young generation (default 700)


def settle_heap() -> None:
    """Collect once, freeze what survives, and raise the young generation's threshold."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
