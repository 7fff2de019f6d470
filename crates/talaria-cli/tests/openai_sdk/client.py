"""Drives Talaria's API server with the official OpenAI Python SDK.

Run by crates/talaria-cli/tests/api_openai_sdk.rs, one case per run, after
the test has scripted the mock model for that case:

    python client.py <case>

The server's base URL and key come from TALARIA_API_BASE and
TALARIA_API_KEY. Every case asserts what the SDK hands to ordinary client
code and exits non-zero (with a traceback) when anything differs; on
success it prints `PASS <case>` and what it saw.
"""

import os
import sys

import openai

BASE = os.environ["TALARIA_API_BASE"]
KEY = os.environ["TALARIA_API_KEY"]
MODEL = os.environ.get("TALARIA_API_MODEL", "mock-model")


def client(key=KEY):
    # No retries: a retried request would consume a second scripted reply
    # and hide what the first attempt got.
    return openai.OpenAI(base_url=BASE + "/v1", api_key=key, max_retries=0, timeout=60)


def collect(stream):
    """The loop every OpenAI streaming example uses. It indexes
    `choices[0]` on every chunk, which is what broke on progress events."""
    text = []
    finish = None
    for chunk in stream:
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
        if chunk.choices[0].finish_reason is not None:
            finish = chunk.choices[0].finish_reason
    return "".join(text), finish


def non_streamed():
    c = client()
    resp = c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "say hello"}]
    )
    assert resp.object == "chat.completion", resp
    assert resp.choices[0].message.role == "assistant", resp
    assert resp.choices[0].message.content == "Hello from Talaria.", resp
    assert resp.choices[0].finish_reason == "stop", resp
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    # The SDK resends the history it was given, answer included: the
    # server continues the session it stored (same session header).
    first = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "remember 42"}]
    )
    answer = first.parse().choices[0].message.content
    again = c.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "remember 42"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "which number?"},
        ],
    )
    s1 = first.headers.get("x-talaria-session-id")
    s2 = again.headers.get("x-talaria-session-id")
    assert s1 and s1 == s2, (s1, s2)
    print("session", s1)


def streamed():
    stream = client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
    )
    text, finish = collect(stream)
    assert text == "Streaming works through the SDK.", text
    assert finish == "stop", finish


def streamed_tool():
    stream = client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "run echo for me"}],
        stream=True,
    )
    text, finish = collect(stream)
    assert text == "The command printed sdk-tool-ok.", text
    assert finish == "stop", finish


def bad_key():
    try:
        client("not-the-key-0123456789").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    except openai.AuthenticationError as e:
        assert e.status_code == 401, e
        assert e.code == "invalid_api_key", e.body
        return
    raise AssertionError("a wrong key was accepted")


def stream_failure():
    stream = client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "this will fail"}],
        stream=True,
    )
    seen = []
    try:
        for chunk in stream:
            delta = chunk.choices[0].delta
            if delta.content:
                seen.append(delta.content)
    except openai.APIError as e:
        # Not a TypeError on `choices` being None, not a silent end: the
        # SDK's own error, carrying the server's message.
        assert "did not complete" in e.message, e.message
        assert isinstance(e.body, dict) and e.body.get("code") == "agent_incomplete", e.body
        print("partial", "".join(seen))
        return
    raise AssertionError("the failed stream ended without an error: %r" % seen)


def failure():
    try:
        client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "this fails too"}]
        )
    except openai.APIStatusError as e:
        assert e.status_code == 502, e
        assert e.code == "agent_incomplete", e.body
        return
    raise AssertionError("a failed turn was answered")


# A 2x2 PNG, as a client would read one from disk.
PNG_2X2 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGP4zwAE/xkgFAAb8gP91pbyKwAAAABJRU5ErkJggg=="
)


def image():
    """An image content part, the way the SDK's vision examples send one:
    a data URL beside the question."""
    c = client()
    resp = c.chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what colour is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG_2X2}},
                ],
            }
        ],
    )
    assert resp.choices[0].message.content == "A tiny picture.", resp


def models():
    c = client()
    m = c.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model", m
    assert [x.id for x in c.models.list()] == [MODEL]
    try:
        c.models.retrieve("no-such-model")
    except openai.NotFoundError as e:
        assert e.code == "model_not_found", e.body
        return
    raise AssertionError("an unknown model was found")


CASES = {
    f.__name__: f
    for f in [non_streamed, streamed, streamed_tool, bad_key, stream_failure, failure, models, image]
}

if __name__ == "__main__":
    case = sys.argv[1]
    CASES[case]()
    print("PASS", case)
