"""How many prompt tokens admission reserves for a call.

Where every deployment that may serve the call knows its model's tokenizer (``Tokenizing``: the
in-process engine), the prompt is counted with it, exactly as the model will see it (chat template
included), or with the tokenizer configured for an HTTP deployment (``tokenizer:``); elsewhere the
call's byte bound is reserved. Either way the reservation is at least what the prompt costs (for
a configured tokenizer: if it is the upstream model's), so a budget check at admission cannot be
undercut by the prompt.
"""

from __future__ import annotations

import logging

from backends.base import BackendError
from gateway.calls import CallDescription
from gateway.off_loop import sized
from gateway.routing.router import ModelGroup

log = logging.getLogger("switchyard.quotas")


async def reserve_prompt(call: CallDescription, group: ModelGroup) -> int:
    """``prompt_reservation``, in a worker thread where a tokenizer would count a prompt past
    ``gateway.off_loop.OFF_LOOP_BOUND`` (a huge prompt held the event loop for seconds, every other request waiting)."""
    if call.count_prompt is None:  # only the bound: nothing to count
        return call.prompt_bound
    return await sized(call.prompt_bound, lambda: prompt_reservation(call, group))


def prompt_reservation(call: CallDescription, group: ModelGroup) -> int:
    """The prompt tokens to reserve for ``call`` served by ``group`` (fallback groups have other
    tokenizers: a group with fallbacks is reserved at the bound)."""
    if call.count_prompt is None or group.config.fallbacks or group.config.context_window_fallbacks:
        return call.prompt_bound
    counts = []
    try:
        for d in group.deployments:
            if d.prompt_counter is None:
                return call.prompt_bound
            counts.append(call.count_prompt(d.prompt_counter))
    except BackendError:  # the template refuses the request: the backend answers that itself
        return call.prompt_bound
    except Exception:
        log.exception("counting the prompt with the model's tokenizer failed; reserving its byte bound")
        return call.prompt_bound
    return max(counts)
