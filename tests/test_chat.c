/*
 * test_chat.c - chat templates: real models' templates rendered and compared
 * byte for byte with what Jinja2 produces as HF transformers configures it
 * (trim_blocks, lstrip_blocks, its tojson and raise_exception), Jinja's
 * semantics case by case, parse errors with positions, the limits on
 * runaway templates, allocation failures, and a mutation fuzz loop.
 *
 * Every expected string below was rendered by jinja2 3.1 with the same
 * template and variables, not written by hand.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/chat.h"
#include "model/gguf.h"
#include "common/mem.h"
#include "tests/testutil.h"

/* ---- templates, as the models ship them (tokenizer.chat_template) -------- */

static const char SMOLLM2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_sta"
    "rt|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
    "' + message['content'] + '<|im_end|>' + '\n"
    "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
    "' }}{% endif %}";

static const char LLAMA2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_mess"
    "age = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message"
    " = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (lo"
    "op.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/"
    "assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content"
    " = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set conte"
    "nt = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' "
    "+ content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.stri"
    "p() + ' ' + eos_token }}{% endif %}{% endfor %}\n";

static const char LLAMA31[] =
    "{{- bos_token }}\n"
    "{%- if custom_tools is defined %}\n"
    "    {%- set tools = custom_tools %}\n"
    "{%- endif %}\n"
    "{%- if not tools_in_user_message is defined %}\n"
    "    {%- set tools_in_user_message = true %}\n"
    "{%- endif %}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- set date_string = \"26 Jul 2024\" %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "\n"
    "{#- System message + builtin tools #}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if builtin_tools is defined or tools is not none %}\n"
    "    {{- \"Environment: ipython\\n\" }}\n"
    "{%- endif %}\n"
    "{%- if builtin_tools is defined %}\n"
    "    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}"
    "}\n"
    "{%- endif %}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{%- if tools is not none and not tools_in_user_message %}\n"
    "    {{- \"You have access to the following functions. To call a function, please respond with JSO"
    "N for a function call.\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name"
    " and its value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n"
    "{%- endif %}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "\n"
    "{#- Custom tools are passed in a user message with some extra guidance #}\n"
    "{%- if tools_in_user_message and not tools is none %}\n"
    "    {#- Extract the first user message so we can plug it in here #}\n"
    "    {%- if messages | length != 0 %}\n"
    "        {%- set first_user_message = messages[0]['content']|trim %}\n"
    "        {%- set messages = messages[1:] %}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"Cannot put tools in the first user message when there's no first us"
    "er message!\") }}\n"
    "{%- endif %}\n"
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n"
    "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name"
    " and its value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n"
    "    {{- first_user_message + \"<|eot_id|>\"}}\n"
    "{%- endif %}\n"
    "\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) "
    "%}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'"
    "] | trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    "        {%- if not message.tool_calls|length == 1 %}\n"
    "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n"
    "        {%- endif %}\n"
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
    "            {%- for arg_name, arg_val in tool_call.arguments | items %}\n"
    "                {{- arg_name + '=\"' + arg_val + '\"' }}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \", \" }}\n"
    "                {%- endif %}\n"
    "                {%- endfor %}\n"
    "            {{- \")\" }}\n"
    "        {%- else  %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "            {{- '\"parameters\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- \"}\" }}\n"
    "        {%- endif %}\n"
    "        {%- if builtin_tools is defined %}\n"
    "            {#- This means we're in ipython mode #}\n"
    "            {{- \"<|eom_id|>\" }}\n"
    "        {%- else %}\n"
    "            {{- \"<|eot_id|>\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}\n"
    "            {{- message.content | tojson }}\n"
    "        {%- else %}\n"
    "            {{- message.content }}\n"
    "        {%- endif %}\n"
    "        {{- \"<|eot_id|>\" }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n";

static const char MISTRAL_NEMO[] =
    "{%- if messages[0][\"role\"] == \"system\" %}\n"
    "    {%- set system_message = messages[0][\"content\"] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n"
    "\n"
    "{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}"
    "\n"
    "{%- set ns = namespace() %}\n"
    "{%- set ns.index = 0 %}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if not (message.role == \"tool\" or message.role == \"tool_results\" or (message.tool_calls "
    "is defined and message.tool_calls is not none)) %}\n"
    "        {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n"
    "            {{- raise_exception(\"After the optional system message, conversation roles must alte"
    "rnate user/assistant/user/assistant/...\") }}\n"
    "        {%- endif %}\n"
    "        {%- set ns.index = ns.index + 1 %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message[\"role\"] == \"user\" %}\n"
    "        {%- if tools is not none and (message == user_messages[-1]) %}\n"
    "            {{- \"[AVAILABLE_TOOLS][\" }}\n"
    "            {%- for tool in tools %}\n"
    "                {%- set tool = tool.function %}\n"
    "                {{- '{\"type\": \"function\", \"function\": {' }}\n"
    "                {%- for key, val in tool.items() if key != \"return\" %}\n"
    "                    {%- if val is string %}\n"
    "                        {{- '\"' + key + '\": \"' + val + '\"' }}\n"
    "                    {%- else %}\n"
    "                        {{- '\"' + key + '\": ' + val|tojson }}\n"
    "                    {%- endif %}\n"
    "                    {%- if not loop.last %}\n"
    "                        {{- \", \" }}\n"
    "                    {%- endif %}\n"
    "                {%- endfor %}\n"
    "                {{- \"}}\" }}\n"
    "                {%- if not loop.last %}\n"
    "                    {{- \", \" }}\n"
    "                {%- else %}\n"
    "                    {{- \"]\" }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "            {{- \"[/AVAILABLE_TOOLS]\" }}\n"
    "            {%- endif %}\n"
    "        {%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- else %}\n"
    "            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n"
    "        {{- \"[TOOL_CALLS][\" }}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- set out = tool_call.function|tojson %}\n"
    "            {{- out[:-1] }}\n"
    "            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n"
    "                {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!"
    "\") }}\n"
    "            {%- endif %}\n"
    "            {{- ', \"id\": \"' + tool_call.id + '\"}' }}\n"
    "            {%- if not loop.last %}\n"
    "                {{- \", \" }}\n"
    "            {%- else %}\n"
    "                {{- \"]\" + eos_token }}\n"
    "            {%- endif %}\n"
    "        {%- endfor %}\n"
    "    {%- elif message[\"role\"] == \"assistant\" %}\n"
    "        {{- message[\"content\"] + eos_token}}\n"
    "    {%- elif message[\"role\"] == \"tool_results\" or message[\"role\"] == \"tool\" %}\n"
    "        {%- if message.content is defined and message.content.content is defined %}\n"
    "            {%- set content = message.content.content %}\n"
    "        {%- else %}\n"
    "            {%- set content = message.content %}\n"
    "        {%- endif %}\n"
    "        {{- '[TOOL_RESULTS]{\"content\": ' + content|string + \", \" }}\n"
    "        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n"
    "            {{- raise_exception(\"Tool call IDs should be alphanumeric strings with length 9!\") }"
    "}\n"
    "        {%- endif %}\n"
    "        {{- '\"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of "
    "an initial optional system message!\") }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n";

static const char QWEN25[] =
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou"
    " are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and argum"
    "ents within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"argume"
    "nts\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assis"
    "tant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message"
    ".role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

static const char PHI35[] =
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|sys"
    "tem|>\n"
    "' + message['content'] + '<|end|>\n"
    "'}}{% elif message['role'] == 'user' %}{{'<|user|>\n"
    "' + message['content'] + '<|end|>\n"
    "'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n"
    "' + message['content'] + '<|end|>\n"
    "'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n"
    "' }}{% else %}{{ eos_token }}{% endif %}";

static const char GEMMA2[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not suppo"
    "rted') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.inde"
    "x0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assista"
    "nt/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %"
    "}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n"
    "' + message['content'] | trim + '<end_of_turn>\n"
    "' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n"
    "'}}{% endif %}";

static const char ZEPHYR[] = "{% for message in messages %}\n"
                             "{% if message['role'] == 'user' %}\n"
                             "{{ '<|user|>\n"
                             "' + message['content'] + eos_token }}\n"
                             "{% elif message['role'] == 'system' %}\n"
                             "{{ '<|system|>\n"
                             "' + message['content'] + eos_token }}\n"
                             "{% elif message['role'] == 'assistant' %}\n"
                             "{{ '<|assistant|>\n"
                             "'  + message['content'] + eos_token }}\n"
                             "{% endif %}\n"
                             "{% if loop.last and add_generation_prompt %}\n"
                             "{{ '<|assistant|>' }}\n"
                             "{% endif %}\n"
                             "{% endfor %}";

/* ---- conversations ------------------------------------------------------- */

typedef struct conv {
    const fy_chat_msg_t *msgs;
    size_t n;
} conv_t;

#define CONV(a) ((conv_t){(a), FY_ARRAY_LEN(a)})

static const fy_chat_msg_t WITH_SYSTEM[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
static const fy_chat_msg_t NO_SYSTEM[] = {{"user", "Hello"}, {"assistant", "Hi there"}, {"user", "How are you?"}};
static const fy_chat_msg_t UNICODE[] = {
    {"system", "Sys"},
    {"user", "\xc3\x9c"
             "n\xc3\xaf"
             "c\xc3\xb6"
             "d\xc3\xa9 \xe2\x9c\x93 test "}, /* "Ünïcödé ✓ test " */
    {"assistant", "ok\n\nline2"},
};
static const fy_chat_msg_t TWO_USERS[] = {{"user", "a"}, {"user", "b"}};

static fy_status_t render(const char *src, const char *bos, const char *eos, conv_t c, bool gen, char **out_p)
{
    fy_chat_template_t *t = NULL;
    fy_status_t st = fy_chat_template_create(src, bos, eos, &t);
    if (st == FY_OK) st = fy_chat_template_apply(t, c.msgs, c.n, gen, out_p);
    fy_chat_template_destroy(t);
    return st;
}

static void expect_render(const char *src, const char *bos, const char *eos, conv_t c, bool gen, const char *expected)
{
    char *out = NULL;
    assert_int_equal(render(src, bos, eos, c, gen, &out), FY_OK);
    if (strcmp(out, expected) != 0) print_message("expected:\n[%s]\ngot:\n[%s]\n", expected, out);
    assert_string_equal(out, expected);
    fy_free(out);
}

/* The render fails with FY_ERR_INVALID and logs "chat template: <msg>". */
static void expect_raise(const char *src, conv_t c, const char *msg)
{
    char *out = NULL;
    fy_test_log_begin();
    fy_status_t st = render(src, "<s>", "</s>", c, true, &out);
    fy_test_log_end();
    assert_int_equal(st, FY_ERR_INVALID);
    assert_null(out);
    assert_true(fy_test_log_has("chat template: ", msg, NULL));
}

/* ---- real templates ------------------------------------------------------ */

static void test_chatml_default(void **state)
{
    (void)state;
    expect_render(NULL, NULL, NULL, CONV(NO_SYSTEM), true,
                  "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
                  "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n");
}

static const char SMOLLM2_WITH_SYSTEM[] = "<|im_start|>system\n"
                                          "You are a helpful assistant<|im_end|>\n"
                                          "<|im_start|>user\n"
                                          "Hello<|im_end|>\n"
                                          "<|im_start|>assistant\n"
                                          "Hi there<|im_end|>\n"
                                          "<|im_start|>user\n"
                                          "Who are you<|im_end|>\n"
                                          "<|im_start|>assistant\n"
                                          "   I am an assistant   <|im_end|>\n"
                                          "<|im_start|>user\n"
                                          "Another question<|im_end|>\n"
                                          "<|im_start|>assistant\n";
static const char SMOLLM2_DEFAULT_SYSTEM[] = /* the template inserts its own system prompt */
    "<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\n"
    "Hello<|im_end|>\n"
    "<|im_start|>assistant\n"
    "Hi there<|im_end|>\n"
    "<|im_start|>user\n"
    "How are you?<|im_end|>\n"
    "<|im_start|>assistant\n";

static void test_smollm2(void **state)
{
    (void)state;
    expect_render(SMOLLM2, "", "", CONV(WITH_SYSTEM), true, SMOLLM2_WITH_SYSTEM);
    expect_render(SMOLLM2, "", "", CONV(NO_SYSTEM), true, SMOLLM2_DEFAULT_SYSTEM);
    expect_render(SMOLLM2, "", "", CONV(NO_SYSTEM), false,
                  "<|im_start|>system\n"
                  "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                  "<|im_start|>user\n"
                  "Hello<|im_end|>\n"
                  "<|im_start|>assistant\n"
                  "Hi there<|im_end|>\n"
                  "<|im_start|>user\n"
                  "How are you?<|im_end|>\n");
}

/* The same, from the template in the default model's GGUF file. */
static void test_smollm2_from_model(void **state)
{
    (void)state;
    const char *path = fy_test_default_model();
    if (!path) skip();
    fy_gguf_t *g = NULL;
    fy_str_t src;
    assert_int_equal(fy_gguf_open(path, &g), FY_OK);
    assert_int_equal(fy_gguf_get_str(g, "tokenizer.chat_template", &src), FY_OK);
    char *z = fy_strndup(src.ptr, (size_t)src.len);
    assert_non_null(z);
    fy_gguf_close(g);
    expect_render(z, "", "", CONV(WITH_SYSTEM), true, SMOLLM2_WITH_SYSTEM);
    expect_render(z, "", "", CONV(NO_SYSTEM), true, SMOLLM2_DEFAULT_SYSTEM);
    fy_free(z);
}

static void test_llama2(void **state)
{
    (void)state;
    expect_render(LLAMA2, "<s>", "</s>", CONV(WITH_SYSTEM), true,
                  "<s>[INST] <<SYS>>\n"
                  "You are a helpful assistant\n"
                  "<</SYS>>\n"
                  "\n"
                  "Hello [/INST] Hi there </s><s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another"
                  " question [/INST]");
    expect_render(LLAMA2, "<s>", "</s>", CONV(NO_SYSTEM), false,
                  "<s>[INST] Hello [/INST] Hi there </s><s>[INST] How are you? [/INST]");
    expect_raise(LLAMA2, CONV(TWO_USERS), "Conversation roles must alternate user/assistant/user/assistant/...");
}

static void test_llama31(void **state)
{
    (void)state;
    expect_render(LLAMA31, "<|begin_of_text|>", "<|eot_id|>", CONV(WITH_SYSTEM), true,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
                  "\n"
                  "Cutting Knowledge Date: December 2023\n"
                  "Today Date: 26 Jul 2024\n"
                  "\n"
                  "You are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                  "\n"
                  "Hello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                  "\n"
                  "Hi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                  "\n"
                  "Who are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                  "\n"
                  "I am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                  "\n"
                  "Another question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                  "\n");
    expect_render(LLAMA31, "<|begin_of_text|>", "<|eot_id|>", CONV(NO_SYSTEM), false,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
                  "\n"
                  "Cutting Knowledge Date: December 2023\n"
                  "Today Date: 26 Jul 2024\n"
                  "\n"
                  "<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                  "\n"
                  "Hello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                  "\n"
                  "Hi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                  "\n"
                  "How are you?<|eot_id|>");
    /* |trim on non-ASCII content */
    expect_render(LLAMA31, "<|begin_of_text|>", "<|eot_id|>", CONV(UNICODE), true,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
                  "\n"
                  "Cutting Knowledge Date: December 2023\n"
                  "Today Date: 26 Jul 2024\n"
                  "\n"
                  "Sys<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                  "\n"
                  "Ünïcödé ✓ test<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                  "\n"
                  "ok\n"
                  "\n"
                  "line2<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                  "\n");
}

static void test_mistral_nemo(void **state)
{
    (void)state;
    /* the system message goes in front of the last user message */
    expect_render(MISTRAL_NEMO, "<s>", "</s>", CONV(WITH_SYSTEM), true,
                  "<s>[INST]Hello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]You ar"
                  "e a helpful assistant\n"
                  "\n"
                  "Another question[/INST]");
    expect_render(MISTRAL_NEMO, "<s>", "</s>", CONV(NO_SYSTEM), true,
                  "<s>[INST]Hello[/INST]Hi there</s>[INST]How are you?[/INST]");
    expect_raise(MISTRAL_NEMO, CONV(TWO_USERS),
                 "After the optional system message, conversation roles must "
                 "alternate user/assistant/user/assistant/...");
}

static void test_qwen25(void **state)
{
    (void)state;
    expect_render(QWEN25, "", "", CONV(WITH_SYSTEM), true,
                  "<|im_start|>system\n"
                  "You are a helpful assistant<|im_end|>\n"
                  "<|im_start|>user\n"
                  "Hello<|im_end|>\n"
                  "<|im_start|>assistant\n"
                  "Hi there<|im_end|>\n"
                  "<|im_start|>user\n"
                  "Who are you<|im_end|>\n"
                  "<|im_start|>assistant\n"
                  "   I am an assistant   <|im_end|>\n"
                  "<|im_start|>user\n"
                  "Another question<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_render(QWEN25, "", "", CONV(NO_SYSTEM), false,
                  "<|im_start|>system\n"
                  "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\n"
                  "Hello<|im_end|>\n"
                  "<|im_start|>assistant\n"
                  "Hi there<|im_end|>\n"
                  "<|im_start|>user\n"
                  "How are you?<|im_end|>\n");
}

static void test_phi35(void **state)
{
    (void)state;
    expect_render(PHI35, "<s>", "<|endoftext|>", CONV(WITH_SYSTEM), true,
                  "<|system|>\n"
                  "You are a helpful assistant<|end|>\n"
                  "<|user|>\n"
                  "Hello<|end|>\n"
                  "<|assistant|>\n"
                  "Hi there<|end|>\n"
                  "<|user|>\n"
                  "Who are you<|end|>\n"
                  "<|assistant|>\n"
                  "   I am an assistant   <|end|>\n"
                  "<|user|>\n"
                  "Another question<|end|>\n"
                  "<|assistant|>\n");
    expect_render(PHI35, "<s>", "<|endoftext|>", CONV(NO_SYSTEM), false,
                  "<|user|>\n"
                  "Hello<|end|>\n"
                  "<|assistant|>\n"
                  "Hi there<|end|>\n"
                  "<|user|>\n"
                  "How are you?<|end|>\n"
                  "<|endoftext|>");
}

static void test_gemma2(void **state)
{
    (void)state;
    expect_render(GEMMA2, "<bos>", "<eos>", CONV(NO_SYSTEM), true,
                  "<bos><start_of_turn>user\n"
                  "Hello<end_of_turn>\n"
                  "<start_of_turn>model\n"
                  "Hi there<end_of_turn>\n"
                  "<start_of_turn>user\n"
                  "How are you?<end_of_turn>\n"
                  "<start_of_turn>model\n");
    expect_raise(GEMMA2, CONV(WITH_SYSTEM), "System role not supported");
}

/* Gemma 3's template (google/gemma-3-*-it; ferry's built-in copy for GGUF
 * files that carry none): the system message becomes the first user turn's
 * prefix, assistant turns are "model", content is trimmed, roles must
 * alternate. */
static void test_gemma3(void **state)
{
    (void)state;
    const char *g3 = fy_chat_template_builtin("gemma");
    assert_non_null(g3);
    assert_non_null(strstr(g3, "first_user_prefix"));
    expect_render(g3, "<bos>", "<eos>", CONV(WITH_SYSTEM), true,
                  "<bos><start_of_turn>user\n"
                  "You are a helpful assistant\n\n"
                  "Hello<end_of_turn>\n"
                  "<start_of_turn>model\n"
                  "Hi there<end_of_turn>\n"
                  "<start_of_turn>user\n"
                  "Who are you<end_of_turn>\n"
                  "<start_of_turn>model\n"
                  "I am an assistant<end_of_turn>\n"
                  "<start_of_turn>user\n"
                  "Another question<end_of_turn>\n"
                  "<start_of_turn>model\n");
    expect_render(g3, "<bos>", "<eos>", CONV(NO_SYSTEM), false,
                  "<bos><start_of_turn>user\n"
                  "Hello<end_of_turn>\n"
                  "<start_of_turn>model\n"
                  "Hi there<end_of_turn>\n"
                  "<start_of_turn>user\n"
                  "How are you?<end_of_turn>\n");
    expect_render(g3, "<bos>", "<eos>", CONV(UNICODE), true,
                  "<bos><start_of_turn>user\n"
                  "Sys\n\n"
                  "\xc3\x9c"
                  "n\xc3\xaf"
                  "c\xc3\xb6"
                  "d\xc3\xa9 \xe2\x9c\x93 test<end_of_turn>\n"
                  "<start_of_turn>model\n"
                  "ok\n\nline2<end_of_turn>\n"
                  "<start_of_turn>model\n");
    expect_raise(g3, CONV(TWO_USERS), "Conversation roles must alternate user/assistant/user/assistant/...");
    assert_null(fy_chat_template_builtin("nonesuch"));
    assert_non_null(fy_chat_template_builtin("chatml"));
}

static void test_zephyr(void **state)
{
    (void)state;
    expect_render(ZEPHYR, "", "</s>", CONV(WITH_SYSTEM), true,
                  "<|system|>\n"
                  "You are a helpful assistant</s>\n"
                  "<|user|>\n"
                  "Hello</s>\n"
                  "<|assistant|>\n"
                  "Hi there</s>\n"
                  "<|user|>\n"
                  "Who are you</s>\n"
                  "<|assistant|>\n"
                  "   I am an assistant   </s>\n"
                  "<|user|>\n"
                  "Another question</s>\n"
                  "<|assistant|>\n");
    expect_render(ZEPHYR, "", "</s>", CONV(NO_SYSTEM), false,
                  "<|user|>\n"
                  "Hello</s>\n"
                  "<|assistant|>\n"
                  "Hi there</s>\n"
                  "<|user|>\n"
                  "How are you?</s>\n");
}

/* ---- Jinja semantics, one construct at a time ---------------------------- */

/* Rendered with NO_SYSTEM, add_generation_prompt, bos "<s>", eos "</s>". */
static const struct {
    const char *src, *expected;
} CASES[] = {
    {"a\n"
     "{% if true %}\n"
     "  b\n"
     "{% endif %}\n"
     "c\n",
     "a\n"
     "  b\n"
     "c"},
    {"  {% if true %}x{% endif %}  \n", "x  "},
    {"a  {%- if true -%}  b  {%- endif -%}  c", "abc"},
    {"{{ 'a' }}\n"
     "{{ 'b' }}\n",
     "a\n"
     "b"},
    {"a\n"
     "  {# comment #}\n"
     "b {#- c -#} d",
     "a\n"
     "bd"},
    {"a\n"
     "  {%+ if true %}b{% endif +%}\n"
     "c",
     "a\n"
     "  b\n"
     "c"},
    {"x\r\n"
     "y\r\n"
     "\r\n",
     "x\n"
     "y\n"},
    {"{% for i in [1, 2] %}\n"
     "  {{ i }}\n"
     "{% endfor %}",
     "  1\n"
     "  2\n"},
    {"a\n"
     "    {{- 'b' -}}\n"
     "   c",
     "abc"},
    {"{{ 'a' ~ 1 ~ none ~ true ~ undefined_name }}|{{ 'a' 'b' }}|{{ 'a\\tb\\u00e9\\x41\\\\\\"
     "'' }}",
     "a1NoneTrue|ab|a\tbéA\\'"},
    {"{{ 1 + 2 * 3 - 4 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 7 % -3 }}|{{ "
     "2 ** 10 }}|{{ -(-3) }}|{{ 10 - 2 - 3 }}",
     "5.0|3|-4|2|-2|1024|3|5"},
    {"{{ 1 ** 1000000000000 }}|{{ 2 ** 62 }}|{{ (-2) ** 63 }}|{{ 2 ** -1 }}|{{ 'abc'.r"
     "eplace('b', '') }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'aaa' | replace('a', 'b',"
     " 1) }}",
     "1|4611686018427387904|-9223372036854775808|0.5|ac|bba|baa"},
    {"{{ 0.1 + 0.2 }}|{{ 1e5 }}|{{ 1.5e16 }}|{{ 3.0 }}|{{ 1 / 3 }}|{{ 2.5 * 2 }}|{{ 1e"
     "-5 }}",
     "0.30000000000000004|100000.0|1.5e+16|3.0|0.3333333333333333|5.0|1e-05"},
    {"{{ [1, 'a', none, true, 1.5] }}|{{ {'k': 'v', 'n': [1]} }}|{{ \"it's\" ~ ['it\\'s',"
     " \"q\\\"\", 'n\\n'] }}",
     "[1, 'a', None, True, 1.5]|{'k': 'v', 'n': [1]}|it's[\"it's\", 'q\"', 'n\\n']"},
    {"{{ (1, 'a') }}|{{ (1,) }}|{{ () }}|{{ [('a', 1)] | tojson }}|{{ (1 + 2) * 3 }}|{"
     "{ ('a', 'b') == ('a', 'b') }}",
     "(1, 'a')|(1,)|()|[[\"a\", 1]]|9|True"},
    {"{{ 'hello'[1:3] }}|{{ 'hello'[::-1] }}|{{ [1, 2, 3, 4][-2:] }}|{{ 'héllo'[1] }}|"
     "{{ [1, 2, 3][::2] }}|{{ 'abc'[-1] }}|{{ 'abc'[5:] }}|{{ [1, 2, 3][:-1] }}|{{ 'hé"
     "llo'[::-2] }}",
     "el|olleh|[3, 4]|é|[1, 3]|c||[1, 2]|olh"},
    {"{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  a b  '.split() }}|{{ 'a,b,"
     ",c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ 'hello wORLD 2x'.title() }}|{{ "
     "'ab'.upper() }}|{{ 'AB'.lower() }}|{{ 'aXbX'.replace('X', '-') }}|{{ 'abc'.start"
     "swith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ '  r'.lstrip() }}|{{ 'l  '.rs"
     "trip() }}|{{ ' nbsp　'.strip() }}",
     "x|hi|['a', 'b']|['a', 'b', '', 'c']|['a', 'b c']|Hello World 2X|AB|ab|a-b-|True|"
     "True|r|l|nbsp"},
    {"{{ '  t  ' | trim }}|{{ [1, 2, 3] | length }}|{{ 'héllo' | length }}|{{ 'abc' | "
     "upper }}|{{ undefined_name | default('d') }}|{{ '' | default('e', true) }}|{{ no"
     "ne | default('n') }}|{{ [1, 2] | first }}|{{ [1, 2] | last }}|{{ [1, 2, 3] | joi"
     "n('-') }}|{{ 'aab' | replace('a', 'c') }}|{{ 42 | string }}|{{ '12' | int + 1 }}"
     "|{{ 'x' | int }}|{{ 'hello WORLD' | capitalize }}|{{ '<b>' | safe }}|{{ 3.7 | in"
     "t }}|{{ 'x' | count }}",
     "t|3|5|ABC|d|e|None|1|2|1-2-3|ccb|42|13|0|Hello world|<b>|3|1"},
    {"{{ {'a': [1, 2.5, none, true], 'b': 'q\"\\né<>'} | tojson }}|{{ [1, {'x': 2}] | to"
     "json(indent=2) }}|{{ 'é😀' | tojson(ensure_ascii=true) }}|{{ [] | tojson(indent=2"
     ") }}|{{ 'x' | tojson }}",
     "{\"a\": [1, 2.5, null, true], \"b\": \"q\\\"\\né<>\"}|[\n"
     "  1,\n"
     "  {\n"
     "    \"x\": 2\n"
     "  }\n"
     "]|\"\\u00e9\\ud83d\\ude00\"|[]|\"x\""},
    {"{{ x is defined }}|{{ x is not defined }}|{{ none is none }}|{{ 'a' is string }}"
     "|{{ {} is mapping }}|{{ [] is iterable }}|{{ 1 is number }}|{{ 1.5 is number }}|"
     "{{ 'a' is number }}|{{ x is iterable }}|{{ 3 is odd }}|{{ 2 is equalto 2 }}|{{ t"
     "rue is boolean }}|{{ 'a' is sequence }}|{{ 0 is false }}",
     "False|True|True|True|True|True|True|True|False|True|True|True|True|True|False"},
    {"{{ 'a' in 'cat' }}|{{ 2 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 3 not in [1] }}|{{"
     " 1 < 2 }}|{{ 'a' < 'b' }}|{{ 1 == 1.0 }}|{{ true == 1 }}|{{ [1, [2]] == [1, [2]]"
     " }}|{{ {'a': 1} == {'a': 1} }}|{{ not 0 }}|{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ 'a'"
     " if false else 'b' }}|{{ 'a' if false }}|{{ [1] + [2] }}|{{ 'ab' * 2 }}|{{ 'x' i"
     "n undefined_name }}|{{ 2 >= 2 }}",
     "True|True|True|True|True|True|True|True|True|True|True|x|y|b||[1, 2]|abab|False|"
     "True"},
    {"{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{"
     "{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.previtem }}{{ x }};{% "
     "endfor %}",
     "10TrueFalse33a;21FalseFalse32ab;32FalseTrue31bc;"},
    {"{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in range(10) if x is odd "
     "%}{{ x }}{{ loop.length }}{% endfor %}|{% for x in range(10) %}{% if x == 3 %}{%"
     " continue %}{% endif %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}|{"
     "% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}|{% for c i"
     "n 'hé' %}[{{ c }}]{% endfor %}|{% for k in {'x': 1} %}{{ k }}{% endfor %}",
     "empty|1535557595|01245|a=1,b=2,|[h][é]|x"},
    {"{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }"
     "}|{% set ns = namespace(t=0) %}{% for i in [1, 2, 3] %}{% set ns.t = ns.t + i %}"
     "{% endfor %}{{ ns.t }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
     "231|6|5"},
    {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet"
     "('A') }} {{ greet('B', punct='?') }} {{ greet(name='C') }}|{% set x %}a{{ 1 + 1 "
     "}}b{% endset %}{{ x | upper }}|{% generation %}g{% endgeneration %}",
     "Hi A! Hi B? Hi C!|A2B|g"},
    {"{{ range(3) | list }}|{{ range(1, 10, 3) | list }}|{{ range(5, 0, -2) | list }}|"
     "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') |"
     " join(',') }}|{{ messages | rejectattr('role', 'equalto', 'user') | list | lengt"
     "h }}|{{ {'b': 1, 'a': 2} | items | list }}|{{ {'b': 1, 'A': 2} | dictsort }}|{{ "
     "[1, 0, 2] | select | list }}|{{ ['a', 'b'] | reject('equalto', 'a') | list }}|{{"
     " ['a', 'B'] | map('upper') | list }}",
     "[0, 1, 2]|[1, 4, 7]|[5, 3, 1]|Hello,How are you?|1|[('b', 1), ('a', 2)]|[('A', 2"
     "), ('b', 1)]|[1, 2]|['b']|['A', 'B']"},
    {"{% set d = {'a': 1} %}{{ d.get('a') }}|{{ d.get('z') }}|{{ d.get('z', 5) }}|{{ d"
     ".keys() | list }}|{{ d.a }}|{{ d['a'] }}|{{ d.zz is defined }}|{{ d.items() | li"
     "st }}",
     "1|None|5|['a']|1|1|False|[('a', 1)]"},
    {"{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | inden"
     "t(1, blank=true) }}",
     "a\n"
     "  b\n"
     "\n"
     "  c|  a\n"
     "  b|a\n"
     " \n"
     " b"},
    {"{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ messages | length"
     " }}|{{ messages[0].role }}|{{ messages[-1]['content'] }}|{{ raise_exception is d"
     "efined }}|{{ messages.0.content }}|{{ tools is defined }}|{{ messages[9] is defi"
     "ned }}",
     "<s>|</s>|True|3|user|How are you?|True|Hello|False|False"},
};

/* ---- tools ----------------------------------------------------------------- */

/* Rendered by jinja2 3.1 (transformers' settings) with TOOLS_JSON as tools
 * and TOOL_CONV with its tool_calls (arguments as an object, as vLLM and
 * transformers pass them) and tool_call_id. */
static const char QWEN25_TOOLS_OUT[] =
    "<|im_start|>system\n"
    "Be brief.\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
    "[\"city\"]}}}\n"
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML "
    "tags:\n"
    "<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "Weather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "{\"temp\": 21}\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n";

static const char LLAMA31_TOOLS_OUT[] =
    "<s><|start_header_id|>system<|end_header_id|>\n"
    "\n"
    "Environment: ipython\n"
    "Cutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n"
    "\n"
    "<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
    "\n"
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that best "
    "answers the given prompt.\n"
    "\n"
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not "
    "use variables.\n"
    "\n"
    "{\n"
    "    \"type\": \"function\",\n"
    "    \"function\": {\n"
    "        \"name\": \"get_weather\",\n"
    "        \"description\": \"Weather in a city\",\n"
    "        \"parameters\": {\n"
    "            \"type\": \"object\",\n"
    "            \"properties\": {\n"
    "                \"city\": {\n"
    "                    \"type\": \"string\"\n"
    "                }\n"
    "            },\n"
    "            \"required\": [\n"
    "                \"city\"\n"
    "            ]\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "{\"name\": \"get_weather\", \"parameters\": {\"city\": "
    "\"Paris\"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n"
    "\n"
    "\"{\\\"temp\\\": 21}\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
    "\n";

static const char TOOLS_JSON[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a "
    "city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
    "\"required\": [\"city\"]}}}]";
static const fy_chat_msg_t TOOL_CONV[] = {
    {"system", "Be brief."},
    {"user", "Weather in Paris?"},
    {"assistant", NULL},
    {"tool", "{\"temp\": 21}"},
};
static const char *const TOOL_EXTRA[] = {
    NULL,
    NULL,
    "{\"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": "
    "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}",
    "{\"tool_call_id\": \"call_1\"}",
};

static void expect_tools_render(const char *src, size_t skip, const char *expected)
{
    fy_chat_template_t *t = NULL;
    char *out = NULL;
    assert_int_equal(fy_chat_template_create(src, "<s>", "</s>", &t), FY_OK);
    assert_int_equal(fy_chat_template_apply_tools(t, TOOL_CONV + skip, TOOL_EXTRA + skip,
                                                  FY_ARRAY_LEN(TOOL_CONV) - skip, TOOLS_JSON, true, &out),
                     FY_OK);
    if (strcmp(out, expected) != 0) print_message("expected:\n[%s]\ngot:\n[%s]\n", expected, out);
    assert_string_equal(out, expected);
    fy_free(out);
    /* JSON that does not parse is refused, not rendered */
    const char *bad_extra[] = {NULL, NULL, "{\"tool_calls\": [", NULL};
    fy_test_log_begin();
    assert_int_equal(fy_chat_template_apply_tools(t, TOOL_CONV, bad_extra, 4, TOOLS_JSON, true, &out), FY_ERR_INVALID);
    assert_int_equal(fy_chat_template_apply_tools(t, TOOL_CONV, NULL, 4, "{\"not\": \"a list\"}", true, &out),
                     FY_ERR_INVALID);
    fy_test_log_end();
    fy_chat_template_destroy(t);
}

/* Qwen 2.5 (Hermes-style <tool_call>, results as <tool_response>) and
 * Llama 3.1 (JSON {"name", "parameters"}, results in the ipython role)
 * render tools, an assistant's tool calls and a tool's result as jinja2
 * does. */
static void test_tools_render(void **state)
{
    (void)state;
    expect_tools_render(QWEN25, 0, QWEN25_TOOLS_OUT);
    expect_tools_render(LLAMA31, 1, LLAMA31_TOOLS_OUT); /* (its tools go in the first user turn) */
}

static void test_semantics(void **state)
{
    (void)state;
    for (size_t k = 0; k < FY_ARRAY_LEN(CASES); k++) {
        print_message("case %zu\n", k);
        expect_render(CASES[k].src, "<s>", "</s>", CONV(NO_SYSTEM), true, CASES[k].expected);
    }
}

static void test_misc(void **state)
{
    (void)state;
    char year[16], *out = NULL;
    time_t now = time(NULL);
    struct tm tm;
    strftime(year, sizeof(year), "%Y", localtime_r(&now, &tm));
    expect_render("{{ strftime_now('%Y') }}", NULL, NULL, CONV(NO_SYSTEM), true, year);

    /* a message without content is None; one without a role is refused */
    const fy_chat_msg_t no_content[] = {{"assistant", NULL}};
    expect_render("{{ messages[0].content is none }}", NULL, NULL, CONV(no_content), true, "True");
    const fy_chat_msg_t no_role[] = {{NULL, "x"}};
    fy_test_log_begin();
    assert_int_equal(render("x", NULL, NULL, CONV(no_role), true, &out), FY_ERR_INVALID);
    fy_test_log_end();
    expect_render("[{{ messages | length }}]", NULL, NULL, (conv_t){NULL, 0}, true, "[0]");

    /* one template, many renders */
    fy_chat_template_t *t = NULL;
    assert_int_equal(fy_chat_template_create(QWEN25, "", "", &t), FY_OK);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(fy_chat_template_apply(t, NO_SYSTEM, FY_ARRAY_LEN(NO_SYSTEM), false, &out), FY_OK);
        assert_string_equal(out, "<|im_start|>system\n"
                                 "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                                 "<|im_start|>user\n"
                                 "Hello<|im_end|>\n"
                                 "<|im_start|>assistant\n"
                                 "Hi there<|im_end|>\n"
                                 "<|im_start|>user\n"
                                 "How are you?<|im_end|>\n");
        fy_free(out);
    }
    fy_test_log_begin();
    assert_int_equal(fy_chat_template_apply(NULL, NO_SYSTEM, 1, false, &out), FY_ERR_INVALID);
    assert_int_equal(fy_chat_template_apply(t, NO_SYSTEM, 1, false, NULL), FY_ERR_INVALID);
    fy_test_log_end();
    fy_chat_template_destroy(t);
    fy_chat_template_destroy(NULL);
}

/* ---- errors -------------------------------------------------------------- */

static void test_render_errors(void **state)
{
    (void)state;
    static const char *const srcs[] = {
        "{{ raise_exception('boom') }}",
        "{{ x.y }}",
        "{{ 1 + 'a' }}",
        "{{ 1 // 0 }}",
        "{{ 'x' < 1 }}",
        "{% set d = {} %}{% set d.x = 1 %}",
        "{{ none | length }}",
        "{% for a, b in [1] %}{% endfor %}",
        "{{ 'a'.get('x') }}",
        "{{ [1][0:1:0] }}",
        "{{ 9223372036854775807 + 1 }}",
        "{{ {1: 2} }}",
        "{{ 2 ** 63 }}",
        "{{ 'x'.replace('', '-') }}",
        "{{ 1e300 * 1e300 | int }}",
    };
    for (size_t k = 0; k < FY_ARRAY_LEN(srcs); k++) {
        char *out = NULL;
        fy_test_log_begin();
        fy_status_t st = render(srcs[k], NULL, NULL, CONV(NO_SYSTEM), true, &out);
        fy_test_log_end();
        if (st != FY_ERR_INVALID) print_message("%s\n", srcs[k]);
        assert_int_equal(st, FY_ERR_INVALID);
        assert_null(out);
        assert_true(fy_test_log_has("chat template: ", NULL));
    }
    expect_raise("\n  {{ raise_exception('custom ' ~ 2) }}", CONV(NO_SYSTEM), "custom 2");
    fy_test_log_begin();
    assert_int_equal(render("\n{{ x.y }}", NULL, NULL, CONV(NO_SYSTEM), true, &(char *){NULL}), FY_ERR_INVALID);
    fy_test_log_end();
    assert_true(fy_test_log_has("chat template: line 2, column 5: 'x' is undefined", NULL));
}

static void test_parse_errors(void **state)
{
    (void)state;
    static const struct {
        const char *src;
        fy_status_t status;
        const char *log;
    } cases[] = {
        {"{{ x | foo }}", FY_ERR_UNSUPPORTED, "line 1, column 8: unknown filter 'foo'"},
        {"a\n\n  {{ x is bar }}", FY_ERR_UNSUPPORTED, "line 3, column 11: unknown test 'bar'"},
        {"{% include 'x' %}", FY_ERR_UNSUPPORTED, "unsupported tag 'include'"},
        {"{{ x.foo() }}", FY_ERR_UNSUPPORTED, "unknown method 'foo'"},
        {"{{ foo() }}", FY_ERR_UNSUPPORTED, "unknown function 'foo'"},
        {"{% for x in y recursive %}{% endfor %}", FY_ERR_UNSUPPORTED, "recursive loops"},
        {"{% set a, b = 1, 2 %}", FY_ERR_UNSUPPORTED, "several targets"},
        {"{{ a < b < c }}", FY_ERR_UNSUPPORTED, "chained comparisons"},
        {"{{ x | join(1, 2, 3) }}", FY_ERR_FORMAT, "filter 'join' takes at most 2 arguments"},
        {"{{ x | replace('a') }}", FY_ERR_FORMAT, "filter 'replace' needs 2 arguments"},
        {"{{ x | trim(foo=1) }}", FY_ERR_UNSUPPORTED, "filter 'trim' has no argument 'foo'"},
        {"{{ x", FY_ERR_FORMAT, "line 1, column 1: '{{' is never closed"},
        {"ab\n{% if x %}a", FY_ERR_FORMAT, "line 2, column 1: 'if' has no '{% endif %}'"},
        {"{% for x in y %}{% endif %}", FY_ERR_FORMAT, "unexpected tag 'endif'"},
        {"{% endfor %}", FY_ERR_FORMAT, "unexpected tag 'endfor'"},
        {"{# x", FY_ERR_FORMAT, "unterminated comment"},
        {"{{ 'abc }}", FY_ERR_FORMAT, "unterminated string"},
        {"{{ (1 }}", FY_ERR_FORMAT, "line 1, column 8: unexpected '}'"},
        {"{{ 1 2 }}", FY_ERR_FORMAT, "expected '}}', got a number"},
        {"{{ ) }}", FY_ERR_FORMAT, "unexpected ')'"},
        {"{{ x @ y }}", FY_ERR_FORMAT, "unexpected character '@'"},
        {"{% break %}", FY_ERR_FORMAT, "'break' outside a loop"},
        {"{% if %}{% endif %}", FY_ERR_FORMAT, "unexpected '%}'"},
        {"{{ }}", FY_ERR_FORMAT, "unexpected '}}'"},
        {"{% %}", FY_ERR_FORMAT, "expected a name"},
        {"{{ 99999999999999999999 }}", FY_ERR_FORMAT, "number out of range"},
        {"{{ 'a\\xZZ' }}", FY_ERR_FORMAT, "invalid escape"},
    };
    for (size_t k = 0; k < FY_ARRAY_LEN(cases); k++) {
        fy_chat_template_t *t = NULL;
        fy_test_log_begin();
        fy_status_t st = fy_chat_template_create(cases[k].src, NULL, NULL, &t);
        fy_test_log_end();
        if (st != cases[k].status || !fy_test_log_has(cases[k].log, NULL))
            print_message("%s -> %s: %s", cases[k].src, fy_status_str(st), fy_test_log_text());
        assert_int_equal(st, cases[k].status);
        assert_null(t);
        assert_true(fy_test_log_has("chat template: ", cases[k].log, NULL));
    }
}

/* ---- limits: a hostile template fails with a status, quickly ------------- */

/* head, open n times, mid, close n times, tail */
static char *nest(const char *head, const char *open, size_t n, const char *mid, const char *close, const char *tail)
{
    size_t ol = strlen(open), cl = strlen(close), hl = strlen(head), ml = strlen(mid), tl = strlen(tail);
    char *s = fy_malloc(hl + (ol + cl) * n + ml + tl + 1), *p = s;
    assert_non_null(s);
    memcpy(p, head, hl), p += hl;
    for (size_t k = 0; k < n; k++) memcpy(p, open, ol), p += ol;
    memcpy(p, mid, ml), p += ml;
    for (size_t k = 0; k < n; k++) memcpy(p, close, cl), p += cl;
    memcpy(p, tail, tl + 1);
    return s;
}

/* A request's template variables (chat_template_kwargs): a Qwen3-style
 * switch that closes an empty thinking block, other values as the template
 * sees them, the caller's own variables winning over a member of the same
 * name, and vars that are not a JSON object refused. */
static void test_template_vars(void **state)
{
    (void)state;
    static const char SRC[] =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
        "{% endif %}{% if style is defined %}[{{ style.tone }} {{ style.n + 1 }} {{ bos_token }}]{% endif %}";
    static const fy_chat_msg_t msgs[] = {{"user", "2+2?"}};
    static const struct {
        const char *vars, *want;
    } cases[] = {
        {NULL, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"},
        {"{}", "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"},
        {"{\"enable_thinking\": true}", "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"},
        {"{\"enable_thinking\": false}",
         "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"},
        /* a 0 is not false (Jinja's 'is false' is the boolean) */
        {"{\"enable_thinking\": 0}", "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"},
        {"{\"style\": {\"tone\": \"dry\", \"n\": 41}, \"bos_token\": \"mine\", \"messages\": []}",
         "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n[dry 42 <s>]"},
    };
    fy_chat_template_t *t = NULL;
    assert_int_equal(fy_chat_template_create(SRC, "<s>", "</s>", &t), FY_OK);
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        char *out = NULL;
        assert_int_equal(fy_chat_template_apply_vars(t, msgs, NULL, 1, NULL, cases[i].vars, true, &out), FY_OK);
        if (strcmp(out, cases[i].want)) fail_msg("vars %s: [%s], want [%s]", cases[i].vars, out, cases[i].want);
        fy_free(out);
    }
    fy_test_log_begin();
    char *out = NULL;
    assert_int_equal(fy_chat_template_apply_vars(t, msgs, NULL, 1, NULL, "[true]", true, &out), FY_ERR_INVALID);
    assert_int_equal(fy_chat_template_apply_vars(t, msgs, NULL, 1, "[]", "{\"a\":", true, &out), FY_ERR_INVALID);
    fy_test_log_end();
    assert_null(out);
    fy_chat_template_destroy(t);
}

static void test_limits(void **state)
{
    (void)state;
    static const char *const runaway[] = {
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% for i in range(1000000000000) %}{% endfor %}",
        "{{ 'x' * 1000000000 }}",
        "{{ [1, 2] * 1000000000 }}",
        "{% set ns = namespace(s='x' * 1000000) %}{% for i in range(10000) %}{% set ns.s = ns.s ~ 'y' %}{% endfor %}",
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
        "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}"
        "{{ ns.l | tojson }}",
        "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    };
    for (size_t k = 0; k < FY_ARRAY_LEN(runaway); k++) {
        char *out = NULL;
        fy_test_log_begin();
        fy_status_t st = render(runaway[k], NULL, NULL, CONV(NO_SYSTEM), true, &out);
        fy_test_log_end();
        if (st != FY_ERR_INVALID) print_message("%s -> %s\n", runaway[k], fy_status_str(st));
        assert_int_equal(st, FY_ERR_INVALID);
        assert_null(out);
    }

    /* deep nesting, in the parser and (a left-deep chain the parser builds flat) at render */
    char *src[] = {
        nest("{{ ", "(", 10000, "1", ")", " }}"),        nest("", "{% if true %}", 10000, "x", "{% endif %}", ""),
        nest("{{ ", "[", 10000, "", "]", " }}"),         nest("{{ ", "not ", 10000, "1", "", " }}"),
        nest("{{ ", "-", 10000, "1", "", " }}"),         nest("{{ 1", " + 1", 10000, "", "", " }}"),
        nest("{{ 'x'", " | trim", 10000, "", "", " }}"), nest("{{ x", ".a", 10000, "", "", " }}"),
    };
    for (size_t k = 0; k < FY_ARRAY_LEN(src); k++) {
        char *out = NULL;
        fy_test_log_begin();
        fy_status_t st = render(src[k], NULL, NULL, CONV(NO_SYSTEM), true, &out);
        fy_test_log_end();
        if (st == FY_OK || !fy_test_log_has("nested deeper than", NULL))
            print_message("%zu: %s", k, fy_test_log_text());
        assert_int_not_equal(st, FY_OK);
        assert_true(fy_test_log_has("nested deeper than", NULL));
        fy_free(src[k]);
    }

    /* big but legitimate */
    char *out = NULL;
    const char *big = "{% for i in range(10000) %}{{ 'x' * 100 }}{% endfor %}";
    assert_int_equal(render(big, NULL, NULL, CONV(NO_SYSTEM), true, &out), FY_OK);
    assert_int_equal(strlen(out), 1000000);
    fy_free(out);

    char *huge = nest("", "x", (2u << 20) + 1, "", "", "");
    fy_test_log_begin();
    assert_int_equal(fy_chat_template_create(huge, NULL, NULL, &(fy_chat_template_t *){NULL}), FY_ERR_INVALID);
    fy_test_log_end();
    fy_free(huge);
}

/* ---- allocation failures ------------------------------------------------- */

static void test_alloc_failures(void **state)
{
    (void)state;
    fy_chat_template_t *t = NULL;
    long n = 1;
    fy_test_log_begin();
    for (;; n++) {
        fy_mem_fail_after(n);
        fy_status_t st = fy_chat_template_create(LLAMA31, "<|begin_of_text|>", "<|eot_id|>", &t);
        fy_mem_fail_after(0);
        if (st == FY_OK) break;
        assert_int_equal(st, FY_ERR_NOMEM);
        assert_null(t);
        assert_true(n < 100000);
    }
    print_message("create: succeeded once %ld allocations could\n", n);
    char *out = NULL;
    for (n = 1;; n++) {
        fy_mem_fail_after(n);
        fy_status_t st = fy_chat_template_apply(t, WITH_SYSTEM, FY_ARRAY_LEN(WITH_SYSTEM), true, &out);
        fy_mem_fail_after(0);
        if (st == FY_OK) break;
        assert_int_equal(st, FY_ERR_NOMEM);
        assert_null(out);
        assert_true(n < 100000);
    }
    fy_test_log_end();
    print_message("apply: succeeded once %ld allocations could\n", n);
    assert_string_equal(out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
                             "\n"
                             "Cutting Knowledge Date: December 2023\n"
                             "Today Date: 26 Jul 2024\n"
                             "\n"
                             "You are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                             "\n"
                             "Hello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                             "\n"
                             "Hi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                             "\n"
                             "Who are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                             "\n"
                             "I am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                             "\n"
                             "Another question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
                             "\n");
    fy_free(out);
    fy_chat_template_destroy(t);
}

/* ---- fuzz: mutated real templates never crash ---------------------------- */

static void fuzz_report(uint64_t seed, int iteration, const char *src)
{
    print_message("fuzz seed 0x%llx, iteration %d, template:\n%s\n", (unsigned long long)seed, iteration, src);
}

static void test_fuzz(void **state)
{
    (void)state;
    const uint64_t seed = 0xc4a7f00d2024ULL;
    static const char *const bases[] = {LLAMA31, MISTRAL_NEMO, QWEN25, GEMMA2, ZEPHYR, SMOLLM2};
    static const char alphabet[] = "{}%#-+()[]'\".|~:,=!<>*/ \n\\aeinorstu0129";
    static const char *const fragments[] = {
        "{{",
        "}}",
        "{%",
        "%}",
        "{%-",
        "-%}",
        "{#",
        "#}",
        " if ",
        " else ",
        "{% endif %}",
        "{% endfor %}",
        " for x in messages ",
        " not ",
        " and ",
        " or ",
        " is defined",
        " is not none",
        "|length",
        "|trim",
        "|tojson(indent=2)",
        "|join(', ')",
        "[::-1]",
        "[1:]",
        "loop.index",
        "loop.last",
        "message['content']",
        "messages[0]",
        "namespace(a=1)",
        "range(3)",
        ".split(' ')",
        ".strip()",
        " ~ ",
        " + ",
        " * 3",
        "(",
        ")",
        "raise_exception('x')",
        "{% set y = 1 %}",
        "{% macro m(a) %}{{ a }}{% endmacro %}",
        "m(1)",
        "{% break %}",
    };
    print_message("fuzz seed 0x%llx\n", (unsigned long long)seed);
    uint64_t rng = seed;
    size_t ok_create = 0, ok_apply = 0, cap = 16384;
    char *buf = fy_malloc(cap);
    assert_non_null(buf);
    fy_test_log_begin();
    for (int it = 0; it < 4000; it++) {
        const char *base = bases[it % FY_ARRAY_LEN(bases)];
        size_t len = strlen(base);
        memcpy(buf, base, len + 1);
        for (int m = 1 + (int)(fy_test_rand_u64(&rng) % 4); m > 0 && len > 0; m--) {
            size_t at = (size_t)(fy_test_rand_u64(&rng) % len), span = 1 + (size_t)(fy_test_rand_u64(&rng) % 16);
            const char *frag = fragments[fy_test_rand_u64(&rng) % FY_ARRAY_LEN(fragments)];
            switch (fy_test_rand_u64(&rng) % 5) {
            case 0: buf[at] = alphabet[fy_test_rand_u64(&rng) % (sizeof(alphabet) - 1)]; break;
            case 1: buf[at] = (char)(1 + fy_test_rand_u64(&rng) % 255); break;
            case 2: len = at; break; /* truncate */
            case 3:                  /* delete a span */
                span = FY_MIN(span, len - at);
                memmove(buf + at, buf + at + span, len - at - span);
                len -= span;
                break;
            default: /* insert a fragment */
                if (len + strlen(frag) >= cap) break;
                memmove(buf + at + strlen(frag), buf + at, len - at);
                memcpy(buf + at, frag, strlen(frag));
                len += strlen(frag);
                break;
            }
            buf[len] = '\0';
        }
        fy_chat_template_t *t = NULL;
        fy_status_t st = fy_chat_template_create(buf, "<s>", "</s>", &t);
        if (st != FY_OK && st != FY_ERR_FORMAT && st != FY_ERR_UNSUPPORTED) fuzz_report(seed, it, buf);
        assert_true(st == FY_OK || st == FY_ERR_FORMAT || st == FY_ERR_UNSUPPORTED);
        if (st != FY_OK) continue;
        ok_create++;
        char *out = NULL;
        st = fy_chat_template_apply(t, WITH_SYSTEM, FY_ARRAY_LEN(WITH_SYSTEM), it & 1, &out);
        if (st != FY_OK && st != FY_ERR_INVALID) fuzz_report(seed, it, buf);
        assert_true(st == FY_OK || st == FY_ERR_INVALID);
        ok_apply += st == FY_OK;
        fy_free(out);
        fy_chat_template_destroy(t);
    }
    fy_test_log_end();
    fy_free(buf);
    print_message("fuzz: %zu of 4000 parsed, %zu rendered\n", ok_create, ok_apply);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chatml_default),
        cmocka_unit_test(test_smollm2),
        cmocka_unit_test(test_smollm2_from_model),
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_mistral_nemo),
        cmocka_unit_test(test_qwen25),
        cmocka_unit_test(test_phi35),
        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_zephyr),
        cmocka_unit_test(test_tools_render),
        cmocka_unit_test(test_semantics),
        cmocka_unit_test(test_misc),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_template_vars),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
