"""Drives Talaria's Responses API with the official OpenAI Python SDK.

Run by crates/talaria-cli/tests/api_responses_sdk.rs, one case per run,
after the test has scripted the mock model for that case:

    python responses.py <case>

The server's base URL and key come from TALARIA_API_BASE and
TALARIA_API_KEY. The SDK builds its objects from what the server sends
without validating them, so every object and event is also validated
strictly here against the SDK's pydantic models: a missing required field,
a wrong type or an item type the SDK does not know fails the case. On
success a case prints `PASS <case>`.
"""

import os
import sys

import openai
import pydantic
from openai.types import Model
from openai.types.responses import Response, ResponseStreamEvent

BASE = os.environ["TALARIA_API_BASE"]
KEY = os.environ["TALARIA_API_KEY"]
MODEL = os.environ.get("TALARIA_API_MODEL", "mock-model")

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def client():
    # No retries: a retried request would consume a second scripted reply.
    return openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=60)


def validated(raw):
    """The JSON body of a raw response, validated as a `Response`."""
    body = raw.http_response.json()
    return Response.model_validate(body), body


def check_response(resp, text, previous=None, store=True):
    assert resp.id.startswith("resp_"), resp.id
    assert resp.object == "response", resp
    assert resp.status == "completed", resp.status
    assert resp.model == MODEL, resp.model
    assert resp.previous_response_id == previous, (resp.previous_response_id, previous)
    assert resp.store is store, resp.store
    assert resp.error is None, resp.error
    message = resp.output[0]
    assert message.type == "message" and message.role == "assistant", message
    assert message.status == "completed", message
    assert message.id.startswith("msg_"), message.id
    part = message.content[0]
    assert part.type == "output_text" and part.annotations == [], part
    assert part.text == text, part.text
    assert resp.output_text == text, resp.output_text
    u = resp.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens, u
    assert u.input_tokens_details.cached_tokens >= 0, u
    assert u.output_tokens_details.reasoning_tokens >= 0, u


def create(c, **kwargs):
    raw = c.responses.with_raw_response.create(model=MODEL, **kwargs)
    resp, body = validated(raw)
    return resp, body, raw.headers.get("x-talaria-session-id")


def expect_404(call, what):
    try:
        call()
    except openai.NotFoundError as e:
        assert e.status_code == 404, e
        assert isinstance(e.body, dict) and e.body.get("code") == "response_not_found", e.body
        return
    raise AssertionError(what + " was found")


def non_streamed():
    c = client()
    resp, body, _ = create(
        c,
        input="say hello",
        instructions="be brief",
        metadata={"case": "non_streamed"},
    )
    check_response(resp, "Hello from Talaria.")
    assert resp.instructions == "be brief", resp.instructions
    assert resp.metadata == {"case": "non_streamed"}, resp.metadata
    assert body["output"][0]["content"][0]["annotations"] == [], body


def run_stream(c, **kwargs):
    """Streams with the SDK's helper, validating every event; the events'
    types and the final response."""
    types = []
    numbers = []
    deltas = []
    with c.responses.stream(model=MODEL, **kwargs) as stream:
        for event in stream:
            EVENT.validate_python(event.to_dict())
            types.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    Response.model_validate(final.to_dict())
    assert numbers == list(range(len(numbers))), numbers
    return final, types, "".join(deltas)


def stream_continue():
    c = client()
    first, _, _ = create(c, input="remember 42")
    check_response(first, "I will remember 42.")
    final, types, streamed = run_stream(c, input="which number?", previous_response_id=first.id)
    check_response(final, "42.", previous=first.id)
    assert streamed == "42.", streamed
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ], types
    assert set(types[4:-4]) == {"response.output_text.delta"}, types
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ], types
    # The streamed response is stored like any other.
    again = c.responses.with_raw_response.retrieve(final.id)
    kept, _ = validated(again)
    assert kept.output_text == "42.", kept


def stream_tool():
    c = client()
    final, types, _ = run_stream(c, input="run echo for me")
    assert final.output_text == "The command printed sdk-tool-ok.", final.output_text
    kinds = [item.type for item in final.output]
    assert kinds == ["message", "function_call", "function_call_output"], kinds
    call, output = final.output[1], final.output[2]
    assert call.name == "terminal" and call.call_id == output.call_id, (call, output)
    assert "sdk-tool-ok" in output.output, output
    assert types.count("response.output_item.added") == 3, types
    assert types.count("response.output_item.done") == 3, types


def branch():
    c = client()
    root, _, root_session = create(c, input="the root question")
    check_response(root, "Root answer.")
    one, _, one_session = create(c, input="branch one", previous_response_id=root.id)
    check_response(one, "Branch one answer.", previous=root.id)
    two, _, two_session = create(c, input="branch two", previous_response_id=root.id)
    check_response(two, "Branch two answer.", previous=root.id)
    # The first continuation moved the root's session on; the second got
    # a session of its own.
    assert one_session == root_session, (one_session, root_session)
    assert two_session != root_session, (two_session, root_session)


def retrieve_delete():
    c = client()
    kept, body, _ = create(c, input="keep this", metadata={"k": "v"})
    check_response(kept, "Kept.")
    raw = c.responses.with_raw_response.retrieve(kept.id)
    got, got_body = validated(raw)
    assert got_body == body, (got_body, body)
    assert got.metadata == {"k": "v"}, got.metadata
    assert c.responses.delete(kept.id) is None
    expect_404(lambda: c.responses.retrieve(kept.id), "a deleted response")
    expect_404(lambda: c.responses.delete(kept.id), "a deleted response")
    expect_404(
        lambda: c.responses.create(model=MODEL, input="go on", previous_response_id=kept.id),
        "a deleted response's conversation",
    )

    unkept, _, _ = create(c, input="do not keep this", store=False)
    check_response(unkept, "Not kept.", store=False)
    expect_404(lambda: c.responses.retrieve(unkept.id), "a response with store false")
    expect_404(
        lambda: c.responses.create(model=MODEL, input="go on", previous_response_id=unkept.id),
        "a response with store false",
    )
    expect_404(lambda: c.responses.retrieve("resp_nope"), "an unknown response")


def models():
    c = client()
    raw = c.models.with_raw_response.retrieve(MODEL)
    m = Model.model_validate(raw.http_response.json())
    assert m.id == MODEL and m.object == "model", m
    assert m.owned_by, m
    try:
        c.models.retrieve("no-such-model")
    except openai.NotFoundError as e:
        assert e.code == "model_not_found", e.body
        return
    raise AssertionError("an unknown model was found")


CASES = {
    f.__name__: f
    for f in [non_streamed, stream_continue, stream_tool, branch, retrieve_delete, models]
}

if __name__ == "__main__":
    case = sys.argv[1]
    CASES[case]()
    print("PASS", case)
