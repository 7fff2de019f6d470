"""The MCP Python SDK's client against `talaria mcp serve` over stdio.

Usage: serve_client.py TALARIA HOME WORD

Runs the server the way an editor or another agent would (the SDK starts
it as a child and speaks JSON-RPC on its stdin/stdout), and checks what a
client relies on: the handshake, the tool list and its schemas, a search
that finds WORD in a stored session, a message to every target the server
lists, and wrong calls that come back as error results while the session
goes on. Every check asserts; any failure exits non-zero with the reason.
The last line of output is a JSON summary for the Rust test.
"""

import json
import os
import sys

import anyio
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS


def text_of(result):
    """The text blocks of a tools/call result, joined."""
    return "\n".join(block.text for block in result.content if block.type == "text")


async def main(talaria, home, word):
    params = StdioServerParameters(
        command=talaria,
        args=["--home", home, "mcp", "serve"],
        # The server finds a running gateway through the home; the test's
        # environment (lock directory, no stray TALARIA_HOME) is passed on.
        env=dict(os.environ),
    )
    summary = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            assert init.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS, init.protocol_version
            assert init.server_info.name == "talaria", init.server_info
            assert init.capabilities.tools is not None, init.capabilities
            summary["protocol_version"] = init.protocol_version

            listed = await session.list_tools()
            tools = {tool.name: tool for tool in listed.tools}
            assert set(tools) == {"session_search", "send_message"}, sorted(tools)
            search_schema = tools["session_search"].input_schema
            assert search_schema["type"] == "object", search_schema
            assert search_schema["required"] == ["query"], search_schema
            assert search_schema["properties"]["query"]["type"] == "string", search_schema
            assert search_schema["properties"]["limit"]["type"] == "integer", search_schema
            send_schema = tools["send_message"].input_schema
            assert send_schema["type"] == "object", send_schema
            assert set(send_schema["properties"]) == {"action", "target", "message"}, send_schema
            assert send_schema["properties"]["action"]["enum"] == ["send", "list"], send_schema
            for tool in tools.values():
                assert tool.description, tool

            found = await session.call_tool("session_search", {"query": word, "limit": 3})
            assert not found.is_error, text_of(found)
            hits = json.loads(text_of(found))
            assert hits["count"] >= 1, hits
            assert any(word in hit["snippet"] for hit in hits["results"]), hits
            summary["search_hits"] = hits["count"]

            # Every target offered must be taken: the one promise a list
            # makes. (`origin` used to be listed, then refused.)
            targets = await session.call_tool("send_message", {"action": "list"})
            assert not targets.is_error, text_of(targets)
            offered = [t["target"] for t in json.loads(text_of(targets))["targets"]]
            assert offered, "no targets listed"
            summary["targets"] = offered
            summary["sent"] = []
            for target in offered:
                sent = await session.call_tool(
                    "send_message", {"target": target, "message": f"hello {target} from the MCP SDK"}
                )
                assert not sent.is_error, f"listed target {target!r} was refused: {text_of(sent)}"
                summary["sent"].append(text_of(sent))

            # Wrong arguments: an error result the client's model can read
            # and correct, not a protocol failure (the specification's
            # "tool execution errors").
            wrong = [
                ("session_search", {}, "query"),
                ("session_search", {"query": word, "limit": "many"}, "limit"),
                ("send_message", {"target": "local"}, "message"),
                ("send_message", {"action": "shout"}, "unknown action"),
                ("send_message", {"target": "origin", "message": "x"}, "origin"),
                ("send_message", {"target": "nowhere-platform", "message": "x"}, "nowhere-platform"),
            ]
            summary["errors"] = []
            for name, args, mentions in wrong:
                result = await session.call_tool(name, args)
                assert result.is_error, f"{name} {args} was not an error: {text_of(result)}"
                assert mentions in text_of(result), f"{name} {args}: {text_of(result)}"
                summary["errors"].append(text_of(result))

            # A tool that does not exist is a protocol error, and the
            # session survives it.
            try:
                await session.call_tool("no_such_tool", {})
            except MCPError as e:
                summary["unknown_tool"] = e.error.message
            else:
                raise AssertionError("a call to an unknown tool succeeded")
            again = await session.call_tool("session_search", {"query": word})
            assert not again.is_error, text_of(again)

    # The SDK's high-level client, as most programs use it: it probes
    # `server/discover` first and takes the newest revision both speak.
    async with Client(params) as client:
        summary["auto_protocol_version"] = client.protocol_version
        found = await client.call_tool("session_search", {"query": word})
        assert not found.is_error, text_of(found)
        assert json.loads(text_of(found))["count"] >= 1, text_of(found)
        listed = await client.call_tool("send_message", {"action": "list"})
        assert not listed.is_error, text_of(listed)
        assert [t["target"] for t in json.loads(text_of(listed))["targets"]] == summary["targets"], text_of(listed)

    print(json.dumps(summary))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3])
