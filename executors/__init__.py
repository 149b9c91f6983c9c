"""executors: the worker pools, and the public tool API they serve.

```python
from executors import ToolRegistry, ToolContext, ProbeResult

tools = ToolRegistry()

@tools.tool(effect="non_idempotent", timeout=5.0, needs_approval=False)
async def create_ticket(ctx: ToolContext, title: str, priority: int = 3) -> str: ...

@create_ticket.probe
async def _(ctx: ToolContext) -> ProbeResult: ...

@create_ticket.compensate
async def _(ctx: ToolContext, original_output: str) -> str: ...
```

The tool API is defined in ``kernel.tools`` and re-exported here, where tool authors look for
it; the worker service is ``executors.worker`` (started by ``toolfleet worker``).
"""

from executors._after_publish import AfterPublish
from kernel import tools
from kernel.tools import *  # noqa: F403  (the tool API, under the name tool authors know)

__all__ = ["AfterPublish", *tools.__all__]  # noqa: PLE0604 (the names of kernel.tools)
