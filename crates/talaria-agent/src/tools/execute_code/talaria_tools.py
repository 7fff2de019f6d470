"""Talaria's tools, callable from an execute_code script.

Each function sends one request to the Talaria process that started this
script and waits for the tool's answer. What comes back is the tool's
result parsed as JSON when it is JSON (a dict or a list), else its text.
A call that fails does not raise: it returns a dict with an "error" key
saying why, so a loop can look at it and carry on.

Only the tools offered in the conversation can be called; the others
answer with an error. A script has a budget of tool calls; calls beyond
it answer with an error too.

The same module is importable as hermes_tools, so scripts written for
Hermes keep working.
"""

import json as _json
import os as _os
import shlex as _shlex
import socket as _socket
import threading as _threading
import time as _time

__all__ = [
    "web_search",
    "web_extract",
    "read_file",
    "write_file",
    "search_files",
    "patch",
    "terminal",
    "json_parse",
    "shell_quote",
    "retry",
]

# Longest socket path connect() takes directly (sun_path is 108 bytes on
# Linux, with room for the terminating NUL); longer ones go through the
# directory's descriptor.
_MAX_SUN_PATH = 100

# One request at a time: the connection carries no request ids, so two
# threads sharing it would read each other's answers.
_lock = _threading.Lock()
_conn = None
_conn_pid = None


def _connect():
    global _conn, _conn_pid
    # A forked child must not share its parent's connection.
    if _conn is not None and _conn_pid == _os.getpid():
        return _conn
    path = _os.environ.get("TALARIA_CODE_SOCKET")
    if not path:
        raise RuntimeError(
            "TALARIA_CODE_SOCKET is not set: talaria_tools only works in a script "
            "run by Talaria's execute_code tool"
        )
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    if len(_os.fsencode(path)) <= _MAX_SUN_PATH:
        sock.connect(path)
    else:
        directory = _os.open(_os.path.dirname(path) or ".", _os.O_RDONLY)
        try:
            sock.connect("/proc/self/fd/%d/%s" % (directory, _os.path.basename(path)))
        finally:
            _os.close(directory)
    _conn, _conn_pid = sock, _os.getpid()
    return sock


def _drop_connection():
    global _conn
    if _conn is not None:
        try:
            _conn.close()
        except OSError:
            pass
    _conn = None


def _call(tool, args):
    request = {
        "tool": tool,
        # Left out, an argument takes the tool's own default.
        "args": {k: v for k, v in args.items() if v is not None},
        "token": _os.environ.get("TALARIA_CODE_TOKEN", ""),
    }
    line = (_json.dumps(request) + "\n").encode("utf-8")
    with _lock:
        try:
            sock = _connect()
            sock.sendall(line)
            reply = bytearray()
            while not reply.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("Talaria closed the connection")
                reply += chunk
        except (OSError, RuntimeError) as e:
            _drop_connection()
            return {"error": "calling %s failed: %s" % (tool, e)}
    answer = _json.loads(reply.decode("utf-8"))
    if "result" not in answer:
        return {"error": answer.get("error", "Talaria sent no result")}
    text = answer["result"]
    try:
        return _json.loads(text)
    except ValueError:
        return text


def web_search(query, limit=None):
    """Search the web; returns the results as the web_search tool gives them."""
    return _call("web_search", {"query": query, "limit": limit})


def web_extract(urls, char_limit=None):
    """Read web pages (a list of http or https URLs) as text."""
    if isinstance(urls, str):
        urls = [urls]
    return _call("web_extract", {"urls": list(urls), "char_limit": char_limit})


def read_file(path, offset=None, limit=None):
    """A text file's lines, numbered as `LINE|content` (offset: first line, 1-based)."""
    return _call("read_file", {"path": path, "offset": offset, "limit": limit})


def write_file(path, content):
    """Writes content to path, replacing the file if it exists."""
    return _call("write_file", {"path": path, "content": content})


def search_files(
    pattern,
    target=None,
    path=None,
    file_glob=None,
    limit=None,
    offset=None,
    output_mode=None,
    context=None,
):
    """Searches inside files (target="content", a regex) or for file names (target="files")."""
    return _call(
        "search_files",
        {
            "pattern": pattern,
            "target": target,
            "path": path,
            "file_glob": file_glob,
            "limit": limit,
            "offset": offset,
            "output_mode": output_mode,
            "context": context,
        },
    )


def patch(path=None, old_string=None, new_string=None, replace_all=None, mode=None):
    """Replaces old_string with new_string in the file at path."""
    return _call(
        "patch",
        {
            "path": path,
            "old_string": old_string,
            "new_string": new_string,
            "replace_all": replace_all,
            "mode": mode,
        },
    )


def terminal(command, timeout=None, workdir=None):
    """Runs a shell command in the foreground; returns its output and exit code."""
    return _call("terminal", {"command": command, "timeout": timeout, "workdir": workdir})


def json_parse(text):
    """json.loads that accepts control characters in strings and a leading BOM."""
    if isinstance(text, str) and text.startswith("\ufeff"):
        text = text[1:]
    return _json.loads(text, strict=False)


def shell_quote(text):
    """text quoted for a shell command line (shlex.quote)."""
    return _shlex.quote(text)


def retry(fn, max_attempts=3, delay=2):
    """Calls fn until it returns without raising, waiting longer after each failure."""
    if max_attempts < 1:
        raise ValueError("retry needs max_attempts of at least 1")
    failure = None
    for attempt in range(max_attempts):
        try:
            return fn()
        except Exception as e:  # the caller decides what is worth retrying
            failure = e
            if attempt + 1 < max_attempts:
                _time.sleep(delay * (2 ** attempt))
    raise failure
