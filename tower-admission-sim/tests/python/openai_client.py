"""The official OpenAI Python client against examples/openai_server.rs.

Run by tests/openai_client.rs with the server's base URL (ending in /v1):

    python3 tests/python/openai_client.py http://127.0.0.1:8000/v1

The server runs one request at a time with no queue (--max-num-seqs 1
--request-queue-limit 0) and a context long enough to hold a stream open
for the whole script (--max-model-len 1000000). Prints one "ok ..." line per
check; any failure raises, and the exit status is non-zero.
"""

import sys

import openai

HOLD_TOKENS = 900_000  # far longer than the script runs


def main(base_url: str) -> None:
    # No retries: a 529 must reach the caller, not be retried away.
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=20.0)
    messages = [{"role": "user", "content": "Say something about admission control."}]

    # A streamed chat completion: role-only first chunk, one chunk per
    # token, a finish chunk, a usage chunk, then [DONE].
    stream = client.chat.completions.create(
        model="sim",
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    assert not chunks[0].choices[0].delta.content, chunks[0]
    pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert len(pieces) == 8, pieces
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"], finishes
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8, chunks[-1]
    assert len({c.id for c in chunks}) == 1
    print("ok stream:", "".join(pieces).strip())

    # A whole chat completion.
    whole = client.chat.completions.create(model="sim", messages=messages, max_tokens=5)
    assert whole.object == "chat.completion", whole
    assert whole.choices[0].message.role == "assistant"
    assert len(whole.choices[0].message.content.split()) == 5, whole
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 5, whole.usage
    print("ok whole:", whole.choices[0].message.content.strip())

    # The legacy completions API, streamed.
    pieces = [
        c.choices[0].text
        for c in client.completions.create(model="sim", prompt="Once upon a time", max_tokens=4, stream=True)
        if c.choices
    ]
    assert len([p for p in pieces if p]) == 4, pieces
    print("ok completion:", "".join(pieces).strip())

    # An invalid request is a 400, BadRequestError.
    try:
        client.chat.completions.create(model="sim", messages=messages, max_tokens=2_000_000)
        raise AssertionError("a request beyond the context was accepted")
    except openai.BadRequestError as error:
        assert error.status_code == 400
        assert error.type == "invalid_request_error", error.body
        assert "maximum context length" in error.message, error.message
        print("ok bad request:", error.status_code, error.type)

    # While a stream holds the only slot, a request is rejected at once
    # with 529, which the client raises as an InternalServerError (any
    # status >= 500), an APIStatusError.
    held = client.chat.completions.create(
        model="sim", messages=messages, max_tokens=HOLD_TOKENS, stream=True
    )
    held_chunks = iter(held)
    assert next(held_chunks).choices[0].delta.role == "assistant"
    assert next(held_chunks).choices[0].delta.content
    try:
        client.chat.completions.create(model="sim", messages=messages, max_tokens=4, stream=True)
        raise AssertionError("a request beyond the limits was admitted")
    except openai.APIStatusError as error:
        assert isinstance(error, openai.InternalServerError), type(error)
        assert error.status_code == 529, error.status_code
        assert error.type == "overloaded", error.body
        assert error.body["scope"] == "worker", error.body
        # The OpenAI error object, as the client parses it.
        assert "param" in error.body and error.param is None, error.body
        assert error.body["code"] == 529, error.body
        assert error.response.headers["retry-after"] == "1"
        assert error.response.headers["x-admission-rejection-scope"] == "worker"
        overload = error
    finally:
        held.close()
    print(f"ok overloaded: {overload.status_code} {overload.type}: {overload.body['message']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} BASE_URL")
    main(sys.argv[1])
