"""A small MCP server (PyPI `mcp` SDK, streamable HTTP) the native MCP client's tests run against.

`python tests/mcp_server.py --port N [--json-response] [--page-size K]` serves at http://127.0.0.1:N/mcp:
`add` (sums two integers), `fail` (raises, so the call answers isError), `sleep` (for timeouts) and
`echo_header` (returns a request header: the client's custom headers arrive). `--json-response` answers each
request with one JSON body instead of an SSE stream; `--page-size` splits tools/list into pages (the SDK
itself answers one page), so the client's cursor loop is exercised.
"""

import argparse
import asyncio
from typing import Any

from mcp.server.mcpserver import Context, MCPServer


class PagedServer(MCPServer):
    """Answers tools/list `page_size` tools at a time, the cursor being the next tool's index."""

    page_size = 0

    async def _handle_list_tools(self, ctx: Any, params: Any) -> Any:
        result = await super()._handle_list_tools(ctx, params)
        if not self.page_size:
            return result
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + self.page_size
        result.tools = result.tools[start:end]
        result.next_cursor = str(end) if end < len(await self.list_tools()) else None
        return result


server = PagedServer("extproc-test-tools")


@server.tool()
def add(a: int, b: int) -> str:
    """Adds two integers."""
    return str(a + b)


@server.tool()
def fail(reason: str) -> str:
    """Always raises."""
    raise ValueError(f"failed on purpose: {reason}")


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleeps, then answers."""
    await asyncio.sleep(seconds)
    return "awake"


@server.tool()
def echo_header(name: str, ctx: Context) -> str:
    """Returns the value of one request header."""
    headers = ctx.headers or {}
    return headers.get(name, "<absent>")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--json-response", action="store_true")
    parser.add_argument("--page-size", type=int, default=0)
    args = parser.parse_args()
    PagedServer.page_size = args.page_size
    server.run(
        transport="streamable-http", host="127.0.0.1", port=args.port, json_response=args.json_response
    )


if __name__ == "__main__":
    main()
