"""openai_check.py BASE_URL KEY - the `openai` Python package against a ferry
router: the model list and one model retrieved by id (and an unknown id's
404), plain and streamed completions and chat, max_completion_tokens on
both endpoints, echo with logprobs and prompt_logprobs on completions,
prompt arrays (strings and token ids, whole and streamed), the errors it raises, and structured outputs and tool calls
(tools with tool_choice required and named, the stream helper accumulating
tool-call deltas, the raw deltas' shape (id and name first, then argument
fragments), parallel_tool_calls=False, a tool result turn after the SDK's
own message, beta.chat.completions.parse with a Pydantic model: strict
where the workers apply grammars, shape only where not, and said so),
and the Responses API (responses.create with instructions,
max_output_tokens, text.format json_schema and a function tool with its
output on the next turn; create(stream=True)'s events and the
responses.stream helper to its final response; refused fields).
Run by tests/test_http.c in a virtual environment; exits non-zero on a
failed check."""
import sys

import openai

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)

if sys.argv[3:] == ["reasoning"]:
    # tests/test_reasoning.c's tiny model, whose template thinks (Qwen3's
    # enable_thinking); a grammar writes the <think> block its random
    # weights would not: reasoning_content (and vLLM's 'reasoning') beside
    # the content, whole and streamed, and none with thinking switched off
    import re
    model = client.models.list().data[0].id
    ask = dict(model=model, messages=[{"role": "user", "content": "2+2?"}], max_tokens=40, temperature=0)
    r = client.chat.completions.create(**ask, extra_body={"guided_regex": "<think>[a-z]{2,5}</think>[a-z]{3}"})
    msg = r.choices[0].message
    extra = msg.model_extra or {}
    assert re.fullmatch("[a-z]{2,5}", extra.get("reasoning_content") or ""), msg
    assert extra.get("reasoning") == extra["reasoning_content"], msg
    assert re.fullmatch("[a-z]{3}", msg.content or ""), msg
    thought, said = "", ""
    for ch in client.chat.completions.create(**ask, stream=True,
                                             extra_body={"guided_regex": "<think>[a-z]{2,5}</think>[a-z]{3}"}):
        if ch.choices:
            thought += (ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            said += ch.choices[0].delta.content or ""
    assert (thought, said) == (extra["reasoning_content"], msg.content), (thought, said, msg)
    r = client.chat.completions.create(**ask, extra_body={"guided_regex": "[a-z]{3}",
                                                          "chat_template_kwargs": {"enable_thinking": False}})
    msg = r.choices[0].message
    assert (msg.model_extra or {}).get("reasoning_content") is None and re.fullmatch("[a-z]{3}", msg.content), msg
    print("openai_check: reasoning: ok")
    sys.exit(0)

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

# echo and logprobs on completions: the prompt then the completion, the
# logprobs covering both (the first prompt token's null), text offsets
# into the returned text; max_tokens 0 with echo is the prompt alone;
# prompt_logprobs (vLLM's) through extra_body, and refused with a stream
e = client.completions.create(model=model, prompt="The sky is", max_tokens=4, temperature=0, echo=True,
                              logprobs=2, extra_body={"ignore_eos": True, "prompt_logprobs": 1})
ch = e.choices[0]
assert ch.text.startswith("The sky is") and len(ch.text) > len("The sky is"), ch.text
lp = ch.logprobs
n = len(lp.tokens)
assert n == e.usage.prompt_tokens + 4 and len(lp.token_logprobs) == n and len(lp.text_offset) == n, lp
assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:]), lp.token_logprobs
assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset), lp.text_offset
assert "".join(lp.tokens) == ch.text, (lp.tokens, ch.text)
assert lp.top_logprobs[0] is None and all(len(t) >= 1 for t in lp.top_logprobs[1:]), lp.top_logprobs
plp = ch.model_extra["prompt_logprobs"]
assert plp[0] is None and len(plp) == e.usage.prompt_tokens, plp
for i, d in enumerate(plp[1:], 1):
    mine = [v for v in d.values() if abs(v["logprob"] - lp.token_logprobs[i]) < 1e-6]
    assert mine and all(v["rank"] >= 1 for v in d.values()), (i, d, lp.token_logprobs[i])
o = client.completions.create(model=model, prompt="The sky is", max_tokens=0, echo=True)
assert o.choices[0].text == "The sky is" and o.usage.completion_tokens == 0, o
try:
    client.completions.create(model=model, prompt="x", max_tokens=2, stream=True, extra_body={"prompt_logprobs": 1})
    raise SystemExit("prompt_logprobs with stream was accepted")
except openai.BadRequestError as e2:
    assert "prompt_logprobs" in str(e2), e2
parts = [x.choices[0].text for x in client.completions.create(
    model=model, prompt="The sky is", max_tokens=4, temperature=0, echo=True, stream=True,
    extra_body={"ignore_eos": True}) if x.choices]
assert parts[0] == "The sky is" and "".join(parts) == ch.text, (parts, ch.text)

# prompt arrays: strings, token ids, arrays of token ids; choice index =
# prompt index * n + k, each prompt's greedy answer the one it gets alone;
# streamed, each chunk's index says whose it is; usage sums the prompts
alone = [client.completions.create(model=model, prompt=p, max_tokens=4, temperature=0,
                                   extra_body={"ignore_eos": True}) for p in ("The sky is", "Two plus two")]
root = openai.OpenAI(base_url=base[:-len("/v1")] if base.endswith("/v1") else base, api_key=key, max_retries=0)
ids = [root.post("/tokenize", body={"prompt": p}, cast_to=object)["tokens"] for p in ("The sky is", "Two plus two")]
for prompt in (["The sky is", "Two plus two"], ids):
    b = client.completions.create(model=model, prompt=prompt, n=2, max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert [x.index for x in b.choices] == [0, 1, 2, 3], b
    assert [x.text for x in b.choices] == [alone[i // 2].choices[0].text for i in range(4)], (b, alone)
    assert b.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone) and b.usage.completion_tokens == 16, b
    got = ["", "", "", ""]
    for x in client.completions.create(model=model, prompt=prompt, n=2, max_tokens=4, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True}):
        for y in x.choices:
            got[y.index] += y.text
    assert got == [x.text for x in b.choices], (got, b)
one = client.completions.create(model=model, prompt=ids[0], max_tokens=4, temperature=0,
                                extra_body={"ignore_eos": True})
assert one.choices[0].text == alone[0].choices[0].text, (one, alone[0])
try:
    client.completions.create(model=model, prompt=[], max_tokens=2)
    raise SystemExit("an empty prompt array was accepted")
except openai.BadRequestError as e3:
    assert "'prompt'" in str(e3), e3

bad = openai.OpenAI(base_url=base, api_key="wrong-key-123", max_retries=0)
try:
    bad.completions.create(model=model, prompt="x", max_tokens=2)
    raise SystemExit("a wrong key was accepted")
except openai.AuthenticationError:
    pass

print("openai %s: models, completions, chat, streaming, max_completion_tokens, echo and logprobs, prompt arrays, "
      "errors: ok" %
      openai.__version__)

# ---- structured outputs and tool calls ----
# Whether the workers apply grammars (a choice list answered verbatim):
# where they do not yet, the checks that need it report so and check the
# answers' shape only.
import json

import pydantic

g = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Pick one."}],
                                   max_tokens=8, temperature=1, seed=3,
                                   extra_body={"guided_choice": ["alpha-17", "beta-42"]})
enforced = g.choices[0].message.content in ("alpha-17", "beta-42")
results = {}

tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"]}}}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(msg, finish):
    """the SDK's parsed tool calls: ids, names, JSON arguments; the calls (or None)"""
    if not msg.tool_calls:
        assert finish != "tool_calls", finish
        return None
    assert finish == "tool_calls", finish
    for c in msg.tool_calls:
        assert c.id.startswith("call_") and c.type == "function", c
        assert isinstance(json.loads(c.function.arguments), dict), c.function.arguments
    return [(c.function.name, c.function.arguments) for c in msg.tool_calls]


# auto: whatever the model says, the SDK reads it
r = client.chat.completions.create(model=model, messages=ask, tools=tools, max_tokens=48, temperature=0)
check_calls(r.choices[0].message, r.choices[0].finish_reason)

# required: the SDK's tool_calls, the arguments valid for the schema
r = client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required",
                                   max_tokens=64, temperature=0)
calls = check_calls(r.choices[0].message, r.choices[0].finish_reason)
if enforced:
    assert calls and calls[0][0] == "get_weather", r
    a = json.loads(calls[0][1])
    assert isinstance(a["city"], str) and a["unit"] in ("C", "F"), a
    results["tools required"] = "ok"
else:
    results["tools required"] = "shape only (%s)" % ("calls" if calls else "no calls")

# streaming: the SDK's stream helper accumulates the tool-call deltas into
# the same calls as the whole answer
streams = getattr(client.chat.completions, "stream", None) or client.beta.chat.completions.stream
with streams(model=model, messages=ask, tools=tools, tool_choice="required", max_tokens=64,
             temperature=0) as s:
    final = s.get_final_completion()
scalls = check_calls(final.choices[0].message, final.choices[0].finish_reason)
assert scalls == calls, (scalls, calls)
results["streamed tool calls"] = "ok" if enforced else "same as whole (%s)" % ("calls" if calls else "no calls")

# the raw chunks, as OpenAI shapes them: a call's first delta has its id,
# type, name and "" arguments; then its arguments come in fragments as
# they are generated (not whole at the end)
firsts, fragments = {}, 0
for ch in client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required",
                                         max_tokens=64, temperature=0, stream=True):
    for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
        if d.index not in firsts:
            assert d.id and d.type == "function" and d.function.name and d.function.arguments == "", d
            firsts[d.index] = d
        else:
            assert d.id is None and d.function.name is None and d.function.arguments, d
            fragments += 1
if enforced:
    assert firsts and fragments >= 2, (firsts, fragments)
results["tool-call deltas"] = "ok (%d fragments)" % fragments

# parallel_tool_calls=False: one call, whatever the tools
more = tools + [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
r = client.chat.completions.create(model=model, messages=ask, tools=more, tool_choice="required",
                                   parallel_tool_calls=False, max_tokens=64, temperature=0)
calls = check_calls(r.choices[0].message, r.choices[0].finish_reason)
if enforced:
    assert calls and len(calls) == 1, calls
results["parallel_tool_calls=False"] = "ok" if enforced else "shape only"

# the conversation goes on: the SDK's own message with its calls, then the tool's result
if r.choices[0].message.tool_calls:
    follow = ask + [r.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": r.choices[0].message.tool_calls[0].id, "content": "21 C"}]
    r2 = client.chat.completions.create(model=model, messages=follow, tools=more, max_tokens=16, temperature=0)
    check_calls(r2.choices[0].message, r2.choices[0].finish_reason)
    results["tool result turn"] = "ok"

# a named function: its arguments
r = client.chat.completions.create(model=model, messages=ask, tools=tools, max_tokens=64, temperature=0,
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
calls = check_calls(r.choices[0].message, r.choices[0].finish_reason)
if enforced:
    assert calls and calls[0][0] == "get_weather" and "city" in json.loads(calls[0][1]), r
results["named tool"] = "ok" if enforced else "shape only"


# beta.chat.completions.parse with a Pydantic model
class Weather(pydantic.BaseModel):
    city: str
    temperature_c: int
    sunny: bool


parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
try:
    p = parse(model=model, messages=[{"role": "user", "content": "The weather in Paris, as JSON."}],
              response_format=Weather, max_tokens=96, temperature=0)
    w = p.choices[0].message.parsed
    assert isinstance(w, Weather), p
    results["parse(Pydantic)"] = "ok"
except (pydantic.ValidationError, openai.LengthFinishReasonError, AssertionError) as e:
    if enforced:
        raise
    results["parse(Pydantic)"] = "not enforced (%s)" % type(e).__name__

print("openai: structured outputs and tools (grammars %s): %s" % (
    "applied" if enforced else "NOT applied by the workers",
    ", ".join("%s: %s" % kv for kv in results.items())))

# ---- the Responses API (POST /v1/responses) ----
import typing

rsp = client.responses.create(model=model, input="Count to fifty.", instructions="Be brief.",
                              max_output_tokens=6, temperature=0)
assert rsp.object == "response" and rsp.id.startswith("resp_"), rsp
assert rsp.output_text and rsp.output[0].type == "message", rsp
assert rsp.usage.input_tokens > 0 and 0 < rsp.usage.output_tokens <= 6, rsp.usage
assert rsp.usage.total_tokens == rsp.usage.input_tokens + rsp.usage.output_tokens, rsp.usage
if rsp.usage.output_tokens == 6:
    assert rsp.status == "incomplete" and rsp.incomplete_details.reason == "max_output_tokens", rsp
else:
    assert rsp.status == "completed", rsp
# the same messages as a chat completion: the same engine path, the same text
r = client.chat.completions.create(model=model, messages=[{"role": "system", "content": "Be brief."},
                                                          {"role": "user", "content": "Count to fifty."}],
                                   max_completion_tokens=6, temperature=0)
assert r.choices[0].message.content == rsp.output_text, (r.choices[0].message.content, rsp.output_text)

# streamed with create(stream=True): the raw events, numbered, and the same text
events = list(client.responses.create(model=model, input="Count to fifty.", instructions="Be brief.",
                                      max_output_tokens=6, temperature=0, stream=True))
types = [e.type for e in events]
assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added"], types
assert types[-4:-1] == ["response.output_text.done", "response.content_part.done",
                        "response.output_item.done"], types
assert types[-1] in ("response.completed", "response.incomplete"), types
assert [e.sequence_number for e in events] == list(range(len(events))), events
assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == rsp.output_text

# the stream helper, to its final response (a schema-forced short answer completes)
yn = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
      "required": ["answer"], "additionalProperties": False}
with client.responses.stream(model=model, input="Is the sky blue?", max_output_tokens=32, temperature=0,
                             text={"format": {"type": "json_schema", "name": "yn", "schema": yn,
                                              "strict": True}}) as stream:
    deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    final = stream.get_final_response()
assert final.status == "completed" and final.output_text == deltas, (final, deltas)
if enforced:
    assert json.loads(final.output_text)["answer"] in ("yes", "no"), final.output_text

# text.format json_schema, whole
rsp = client.responses.create(model=model, input="Is the sky blue?", max_output_tokens=32, temperature=0,
                              text={"format": {"type": "json_schema", "name": "yn", "schema": yn, "strict": True}})
if enforced:
    assert json.loads(rsp.output_text)["answer"] in ("yes", "no"), rsp.output_text

# responses.parse with a Pydantic model (its schema through text.format)
class YesNo(pydantic.BaseModel):
    answer: typing.Literal["yes", "no"]


p = client.responses.parse(model=model, input="Is the sky blue? Answer as JSON.", text_format=YesNo,
                           max_output_tokens=32, temperature=0)
if enforced:
    assert isinstance(p.output_parsed, YesNo), p

# a function tool: a function_call item, then its output on the next turn
rtools = [{"type": "function", "name": "get_weather", "description": "The current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
rsp = client.responses.create(model=model, input="What is the weather in Paris?", tools=rtools,
                              tool_choice={"type": "function", "name": "get_weather"},
                              max_output_tokens=48, temperature=0)
fcs = [o for o in rsp.output if o.type == "function_call"]
if enforced:
    assert fcs and fcs[0].name == "get_weather" and "city" in json.loads(fcs[0].arguments), rsp
for fc in fcs:
    assert fc.call_id and json.loads(fc.arguments) is not None, fc
if fcs:
    fc = fcs[0]
    rsp2 = client.responses.create(model=model, tools=rtools, max_output_tokens=16, temperature=0, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
        {"type": "function_call_output", "call_id": fc.call_id, "output": "21 C and sunny"}])
    assert rsp2.output, rsp2
    # streamed through the helper: the call's argument deltas add up to its arguments
    with client.responses.stream(model=model, input="What is the weather in Paris?", tools=rtools,
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 max_output_tokens=48, temperature=0) as stream:
        args = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        final = stream.get_final_response()
    sfc = [o for o in final.output if o.type == "function_call"]
    assert sfc and sfc[0].arguments == args == fc.arguments, (final, args)

# what ferry does not keep or run: 400s naming the field
for kwargs, param in (({"previous_response_id": "resp_x"}, "previous_response_id"),
                      ({"tools": [{"type": "web_search"}]}, "tools")):
    try:
        client.responses.create(model=model, input="x", **kwargs)
        raise SystemExit("/v1/responses took %s" % kwargs)
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param == param, e

print("openai: responses (text, instructions, max_output_tokens, create(stream=True), the stream helper, "
      "text.format json_schema, responses.parse, a function tool and its output): ok")
