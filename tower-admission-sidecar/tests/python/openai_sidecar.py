"""The official OpenAI Python client through the sidecar, in front of a real
llama.cpp server with two slots (tests/llama_cpp.rs starts both).

    python3 tests/python/openai_sidecar.py http://127.0.0.1:9000/v1

The sidecar runs with no queue (--request-queue-limit 0): with both slots
streaming, a third request is answered 529 at once. Prints one "ok ..." line
per check; any failure raises, and the exit status is non-zero.
"""

import sys

import openai

LONG = 30_000  # tokens: far longer than the script runs


def main(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30.0)
    messages = [{"role": "user", "content": "Say something about admission control."}]

    # A streamed chat completion: llama.cpp sends a role-only first chunk,
    # one chunk per token, a finish chunk, then [DONE].
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=16, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 16, f"{len(content)} content chunks"
    assert chunks[-1].choices[0].finish_reason == "length", chunks[-1]
    print(f"ok stream: {len(chunks)} chunks, {len(content)} with content")

    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    assert whole.choices[0].message.content, whole
    assert whole.usage.completion_tokens == 8, whole.usage
    print("ok whole: 8 completion tokens")

    # Both slots busy, no queue: the third is an overload, at once.
    held = []
    for _ in range(2):
        s = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=LONG, stream=True
        )
        next(iter(s))
        held.append(s)
    try:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    except openai.APIStatusError as error:
        assert error.status_code == 529, error.status_code
        assert error.response.headers["x-admission-rejection-scope"] == "worker"
        assert error.response.headers["retry-after"] == "1"
        body = error.response.json()
        assert body["error"]["type"] == "overloaded", body
        print("ok overload: 529, worker scope, Retry-After 1")
    else:
        raise AssertionError("the third request was not rejected")
    finally:
        for s in held:
            s.close()


if __name__ == "__main__":
    main(sys.argv[1])
