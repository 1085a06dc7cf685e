"""Drives a running `loom serve` with the official `openai` Python client: models,
completions, chat, streaming, and errors surfacing as the client's exception types.
Run by run_openai_client_test.sh, which starts the server (one running sequence, no queue,
so a second concurrent request is refused with 429)."""
import argparse
import sys
import time

import openai


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


def expect_error(exc_type, what, fn, param=None):
    try:
        fn()
    except exc_type as e:
        if param is not None:
            body = e.body if isinstance(e.body, dict) else {}
            got = body.get("param", getattr(e, "param", None))
            check(got == param, f"{what}: {exc_type.__name__} naming param '{param}' (got {got!r})")
        else:
            check(True, f"{what}: {exc_type.__name__} ({e.status_code})")
        return
    raise AssertionError(f"{what}: expected {exc_type.__name__}, no error raised")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    # The server runs one sequence and queues none, and releases a request's slot just after its
    # response's last bytes: a request sent the instant the previous one ended can meet a 429.
    # Retrying it, as the SDK does by default, is what a client of such a server does.
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=2, timeout=30)
    m = a.model

    models = [x.id for x in client.models.list()]
    check(models == [m], f"models.list() == [{m}]")
    check(client.models.retrieve(m).id == m, "models.retrieve()")

    c1 = client.completions.create(model=m, prompt="Once upon a time", max_tokens=12, seed=5, temperature=0.8)
    c2 = client.completions.create(model=m, prompt="Once upon a time", max_tokens=12, seed=5, temperature=0.8)
    check(c1.choices[0].text == c2.choices[0].text, "same seed, same completion")
    check(c1.choices[0].finish_reason == "length", "finish_reason length")
    check(c1.usage.completion_tokens == 12 and c1.usage.prompt_tokens == 16, "completion usage")

    g = client.completions.create(model=m, prompt="abc", max_tokens=8, temperature=0, top_p=0.5,
                                  extra_body={"top_k": 1})
    check(len(g.choices[0].text) > 0, "greedy completion")

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model=m, messages=messages, max_tokens=6, seed=1)
    check(chat.choices[0].message.role == "assistant", "chat message role")
    check(isinstance(chat.choices[0].message.content, str), "chat content")
    check(chat.usage.completion_tokens <= 6, "chat usage")

    pieces, finish, usage = [], None, None
    for chunk in client.completions.create(model=m, prompt="Once upon a time", max_tokens=12, seed=5,
                                           temperature=0.8, stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        usage = getattr(chunk, "usage", None) or usage
    check("".join(pieces) == c1.choices[0].text, "streamed text equals the non-streamed text")
    check(finish == "length", "streamed finish_reason")

    deltas, usage = [], None
    stream = client.chat.completions.create(model=m, messages=messages, max_tokens=6,
                                            seed=1, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            deltas.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    check("".join(deltas) == chat.choices[0].message.content, "streamed chat equals the non-streamed chat")
    check(usage is not None and usage.completion_tokens == chat.usage.completion_tokens, "stream usage chunk")

    expect_error(openai.BadRequestError, "negative max_tokens",
                 lambda: client.completions.create(model=m, prompt="x", max_tokens=-1), "max_tokens")
    expect_error(openai.BadRequestError, "temperature out of range",
                 lambda: client.completions.create(model=m, prompt="x", temperature=5), "temperature")
    expect_error(openai.BadRequestError, "top_p out of range",
                 lambda: client.chat.completions.create(model=m, messages=[{"role": "user", "content": "x"}],
                                                        top_p=0), "top_p")
    expect_error(openai.BadRequestError, "unknown model",
                 lambda: client.completions.create(model="no-such-model", prompt="x"), "model")
    expect_error(openai.BadRequestError, "prompt beyond the context",
                 lambda: client.completions.create(model=m, prompt="x" * 5000, max_tokens=1), "prompt")
    expect_error(openai.NotFoundError, "unknown model id", lambda: client.models.retrieve("no-such-model"))
    bad = openai.OpenAI(base_url=a.base_url, api_key="wrong-key", max_retries=0)
    expect_error(openai.AuthenticationError, "wrong API key",
                 lambda: bad.completions.create(model=m, prompt="x", max_tokens=1))

    # Queue full: while a long stream holds the only slot, a second request gets 429.
    long = client.completions.create(model=m, prompt="x", max_tokens=900, stream=True)
    first = next(iter(long))
    check(first.choices[0].finish_reason is None, "long stream started")
    no_retry = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=30)
    expect_error(openai.RateLimitError, "queue full",
                 lambda: no_retry.completions.create(model=m, prompt="x", max_tokens=1))
    long.close()  # disconnects mid-stream; the server notices, aborts it and frees the slot
    deadline, after = time.time() + 10, None
    while after is None:
        try:
            after = client.completions.create(model=m, prompt="x", max_tokens=2)
        except openai.RateLimitError:
            if time.time() > deadline:
                raise
            time.sleep(0.02)
    check(after.usage.completion_tokens == 2, "slot freed after the disconnect")
    print("ALL OPENAI CLIENT CHECKS PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
