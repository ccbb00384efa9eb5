"""Real prompts of an endpoint for SAO: the tasks of its recent traces (the input of each
trace's root or first prompt span), read from the trace store's QueryTraces, newest first,
without repeats (the trace store's prompt key: whitespace collapsed, lower case)."""

from __future__ import annotations

from flywheel.api.common.v1.common_pb2 import PageRequest
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.society.clients import _Link
from flywheel.society.sao.dataset import prompt_key
from flywheel.society.settings import SocietySettings

PAGE_SIZE = 200
MAX_PAGES = 10  # a busy endpoint is not scanned to its first trace
MAX_PROMPT_CHARS = 8000  # longer tasks (whole documents) make poor SAO prompts


class TracePrompts:
    """``fetch(endpoint, limit)``: up to ``limit`` distinct prompts of the endpoint's traces.
    Raises :class:`flywheel.society.clients.LinkError` when the trace store fails or is not
    configured (``configured`` says which)."""

    def __init__(self, settings: SocietySettings) -> None:
        self._link = _Link(settings, "trace_store", ts_grpc.TraceStoreServiceStub)

    @property
    def configured(self) -> bool:
        return self._link.configured

    async def fetch(self, endpoint: str, limit: int) -> list[str]:
        prompts: list[str] = []
        seen: set[str] = set()
        token = ""
        for _ in range(MAX_PAGES):
            request = ts_pb.QueryTracesRequest(
                endpoint=endpoint, page=PageRequest(page_size=PAGE_SIZE, page_token=token)
            )
            got = await self._link.call("QueryTraces", request)
            for trace in got.traces:
                task = trace.task.strip()
                key = prompt_key(task)
                if task and len(task) <= MAX_PROMPT_CHARS and key not in seen:
                    seen.add(key)
                    prompts.append(task)
                    if len(prompts) >= limit:
                        return prompts
            token = got.next_page_token
            if not token:
                break
        return prompts

    async def close(self) -> None:
        await self._link.close()
