// The Olmo 3 Think chat template (open-instruct `olmo_thinker`, as quoted in
// docs/reference/sft_pipeline.md 1.3 and /work/shared/reference/templates/olmo_thinker.jinja), embedded for
// `olmosft tokenizer dolma2`. tests/unit/data/tok_labels_test.cpp checks it equals
// tests/golden/tok/templates/olmo3_think.jinja byte for byte.
#include "data/template_olmo.h"

namespace olmosft {

// clang-format off
const char* const kOlmo3ThinkTemplate =
    R"JINJA({% set has_system = messages|selectattr('role', 'equalto', 'system')|list|length > 0 %}{% if not has)JINJA"
    R"JINJA(_system %}{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}{% endif %}{% for m)JINJA"
    R"JINJA(essage in messages %}{% if message['role'] == 'system' %}{{ '<|im_start|>system\n' + message['conten)JINJA"
    R"JINJA(t'] }}{% if message.get('functions', none) is not none %}{{ ' <functions>' + message['functions'] + )JINJA"
    R"JINJA('</functions><|im_end|>\n' }}{% else %}{{ ' You do not currently have access to any functions. <func)JINJA"
    R"JINJA(tions></functions><|im_end|>\n' }}{% endif %}{% elif message['role'] == 'user' %}{% if message.get(')JINJA"
    R"JINJA(functions', none) is not none %}{{ '<|im_start|>user\n' + message['content'] + '\n' + '<functions>' )JINJA"
    R"JINJA(+ message['functions'] + '</functions><|im_end|>\n' }}{% else %}{{ '<|im_start|>user\n' + message['c)JINJA"
    R"JINJA(ontent'] + '<|im_end|>\n' }}{% endif %}{% elif message['role'] == 'assistant' %}{{ '<|im_start|>assi)JINJA"
    R"JINJA(stant\n' }}{% if message.get('content', none) is not none %}{{ message['content'] }}{% endif %}{% if)JINJA"
    R"JINJA( message.get('function_calls', none) is not none %}{{ '<function_calls>' + message['function_calls'])JINJA"
    R"JINJA( + '</function_calls>' }}{% endif %}{% if not loop.last %}{{ '<|im_end|>' + '\n' }}{% else %}{{ eos_)JINJA"
    R"JINJA(token }}{% endif %}{% elif message['role'] == 'environment' %}{{ '<|im_start|>environment\n' + messa)JINJA"
    R"JINJA(ge['content'] + '<|im_end|>\n' }}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|im_sta)JINJA"
    R"JINJA(rt|>assistant\n<think>' }}{% endif %}{% endfor %})JINJA";
// clang-format on

}  // namespace olmosft
