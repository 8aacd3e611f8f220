"""openai_check.py BASE_URL KEY - the `openai` Python package against a ferry
router: the model list and one model retrieved by id (and an unknown id's
404), plain and streamed completions and chat, max_completion_tokens on
both endpoints, and the errors it raises.
Run by tests/test_http.c in a virtual environment; exits non-zero on a
failed check."""
import sys

import openai

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)

models = [m.id for m in client.models.list()]
assert models, models
model = models[0]

m = client.models.retrieve(model)
assert m.id == model and m.object == "model", m
try:
    client.models.retrieve("no-such-model")
    raise SystemExit("an unknown model id was found")
except openai.NotFoundError as e:
    assert e.status_code == 404 and "no-such-model" in str(e), e

c = client.completions.create(model=model, prompt="The sky is", max_tokens=8, temperature=0)
assert c.choices[0].text, c
assert 0 < c.usage.completion_tokens <= 8 and c.usage.prompt_tokens > 0, c.usage
assert c.choices[0].finish_reason in ("length", "stop"), c

parts = [ch.choices[0].text for ch in client.completions.create(
    model=model, prompt="The sky is", max_tokens=8, temperature=0, stream=True) if ch.choices]
assert "".join(parts) == c.choices[0].text, (parts, c.choices[0].text)

r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                   max_tokens=10, temperature=0)
assert r.choices[0].message.role == "assistant" and r.choices[0].message.content, r
assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 10, r.usage

text = ""
for ch in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                         max_tokens=10, temperature=0, stream=True):
    if ch.choices and ch.choices[0].delta.content:
        text += ch.choices[0].delta.content
assert text == r.choices[0].message.content, (text, r.choices[0].message.content)

c = client.completions.create(model=model, prompt="The sky is", temperature=0,
                              extra_body={"max_completion_tokens": 3, "ignore_eos": True})
assert c.usage.completion_tokens == 3, c.usage
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count to fifty."}],
                                   max_completion_tokens=4, temperature=0, extra_body={"ignore_eos": True})
assert r.usage.completion_tokens == 4, r.usage

try:
    client.completions.create(model=model, prompt="x", max_tokens=0)
    raise SystemExit("max_tokens=0 was accepted")
except openai.BadRequestError as e:
    assert "max_tokens" in str(e), e

bad = openai.OpenAI(base_url=base, api_key="wrong-key-123", max_retries=0)
try:
    bad.completions.create(model=model, prompt="x", max_tokens=2)
    raise SystemExit("a wrong key was accepted")
except openai.AuthenticationError:
    pass

print("openai %s: models, completions, chat, streaming, max_completion_tokens, errors: ok" % openai.__version__)
