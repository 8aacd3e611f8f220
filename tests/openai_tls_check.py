"""openai_tls_check.py BASE_URL CA_FILE KEY - the `openai` Python package
against a ferry router whose door speaks HTTPS (router.tls_cert): a
completion and a streamed chat over TLS, the server's certificate checked
against CA_FILE; then the same client without the CA must fail its
handshake (the certificate is not trusted by the system's store).  Run by
tests/test_http_tls.c; exits non-zero on a failed check."""
import ssl
import sys

import openai

base, ca, key = sys.argv[1], sys.argv[2], sys.argv[3]
assert base.startswith("https://"), base
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120,
                       http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca)))

model = [m.id for m in client.models.list()][0]
c = client.completions.create(model=model, prompt="The secret word is", max_tokens=8, temperature=0)
assert c.choices[0].text and 0 < c.usage.completion_tokens <= 8, c

r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                   max_tokens=10, temperature=0)
text, chunks = "", 0
for ch in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                         max_tokens=10, temperature=0, stream=True):
    chunks += 1
    if ch.choices and ch.choices[0].delta.content:
        text += ch.choices[0].delta.content
assert chunks >= 2 and text == r.choices[0].message.content, (chunks, text, r.choices[0].message.content)

untrusting = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=30)
try:
    untrusting.models.list()
    raise SystemExit("a client without the CA was served")
except openai.APIConnectionError as e:
    assert "CERTIFICATE_VERIFY_FAILED" in repr(e.__cause__) or "certificate" in repr(e.__cause__).lower(), e.__cause__
print("openai over https: completion %r, streamed chat in %d chunks" % (c.choices[0].text, chunks))
