"""An MCP server (stdio) whose tools answer with what is not text: an image, a resource link, an
embedded resource (text and blob), and a mix of text and image, as foreign servers do."""

import base64

from mcp.server.mcpserver import MCPServer
from mcp_types import BlobResourceContents, EmbeddedResource, ImageContent, ResourceLink, TextContent, \
    TextResourceContents

# A 1x1 PNG: small, and a real image file once stored.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
BLOB = b"\x00\x01binary report\xff"

server = MCPServer("content", log_level="WARNING")


def _image() -> ImageContent:
    return ImageContent(data=base64.b64encode(PNG).decode(), mime_type="image/png")


@server.tool()
async def snapshot() -> list[ImageContent]:
    """A picture of the dashboard."""
    return [_image()]


@server.tool()
async def chart(metric: str) -> list[TextContent | ImageContent]:
    """A caption, then a chart of `metric`."""
    return [TextContent(text=f"Chart of {metric}:"), _image(), TextContent(text="(daily values)")]


@server.tool()
async def find_report(name: str) -> list[TextContent | ResourceLink]:
    """Where the report `name` lives."""
    return [TextContent(text="Found it."),
            ResourceLink(uri=f"file:///reports/{name}.pdf", name=f"{name}.pdf", mime_type="application/pdf",
                         description="the quarterly report")]


@server.tool()
async def read_report(name: str) -> list[EmbeddedResource]:
    """The report `name`'s notes (text) and its raw data (binary)."""
    return [EmbeddedResource(resource=TextResourceContents(uri=f"file:///reports/{name}.txt", mime_type="text/plain",
                                                           text="Revenue grew 4%.")),
            EmbeddedResource(resource=BlobResourceContents(uri=f"file:///reports/{name}.bin",
                                                           mime_type="application/octet-stream",
                                                           blob=base64.b64encode(BLOB).decode()))]


if __name__ == "__main__":
    server.run()
