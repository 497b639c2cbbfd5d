"""Golden chat-template renders from Python Jinja2, configured the way HF transformers renders chat templates:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[generation tracker, loopcontrols]),
the raise_exception global, and HF's tojson filter (json.dumps, ensure_ascii=False, key order kept).

Writes tests/golden/tok/templates.json: for every template x conversation x add_generation_prompt the rendered
text (or the error raised) and the byte ranges of {% generation %} blocks; plus, per conversation, the prefix
renders the span rule needs (render(conv[:i], gen=True) and render(conv[:i+1]) for assistant i), which
tests/reference/tok_labels.py tokenizes into reference label masks.
Usage: deps/venv-reference/bin/python tests/reference/tok_templates.py   (jinja2 3.1.6; scripts/make-fixtures.sh)
"""
import json
import os

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TDIR = os.path.join(ROOT, "tests/golden/tok/templates")
START, END = "\ue000", "\ue001"  # private-use markers around generation blocks (absent from the data)


class GenerationMarker(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller):
        return START + caller() + END


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationMarker, jinja2.ext.loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render(tmpl, messages, add_generation_prompt, extra):
    out = tmpl.render(messages=messages, add_generation_prompt=add_generation_prompt, eos_token="<|endoftext|>",
                      bos_token="<|endoftext|>", **extra)
    text, spans, pos = "", [], 0
    i = 0
    while i < len(out):
        c = out[i]
        if c == START:
            spans.append([len(text.encode("utf-8")), None])
        elif c == END:
            spans[-1][1] = len(text.encode("utf-8"))
        else:
            text += c
        i += 1
    return text, spans


TOOLS = [{"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
FUNCS = json.dumps(TOOLS)

CONVERSATIONS = {
    "single_turn": [{"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "<think>Add them.</think>4"}],
    "with_system": [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello."}],
    "multi_turn": [{"role": "user", "content": "Name a colour."},
                   {"role": "assistant", "content": "<think>Pick one.</think>Blue."},
                   {"role": "user", "content": "Another?"},
                   {"role": "assistant", "content": "<think>Different one.</think>Red."},
                   {"role": "user", "content": "Thanks!"},
                   {"role": "assistant", "content": "You're welcome."}],
    "tools": [{"role": "system", "content": "Use tools.", "functions": FUNCS},
              {"role": "user", "content": "Weather in Paris?", "functions": FUNCS},
              {"role": "assistant", "content": "<think>Call the tool.</think>",
               "function_calls": "get_weather(city=\"Paris\")"},
              {"role": "environment", "content": "{\"temp_c\": 21}"},
              {"role": "assistant", "content": "It is 21 °C in Paris."}],
    "tool_role": [{"role": "user", "content": "List files"},
                  {"role": "assistant", "content": "", "function_calls": "ls()"},
                  {"role": "tool", "content": "a.txt\nb.txt"},
                  {"role": "assistant", "content": "Two files: a.txt, b.txt"}],
    "ends_with_user": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                       {"role": "user", "content": "Q2"}],
    "unicode_and_specials": [{"role": "user", "content": "  東京の天気は？ 🌧️ <|im_end|> is text here\n\n"},
                             {"role": "assistant", "content": "雨です。\n\n  Ünïcödé — ok  "}],
    "null_content": [{"role": "user", "content": "call it"},
                     {"role": "assistant", "content": None, "function_calls": "f()"},
                     {"role": "environment", "content": "done"},
                     {"role": "assistant", "content": "Finished."}],
    "context_after_last_assistant": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
                                     {"role": "environment", "content": "log line"}],
    "late_system": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "late"},
                    {"role": "assistant", "content": "Yo"}],
    "bad_role": [{"role": "user", "content": "Hi"}, {"role": "narrator", "content": "Meanwhile"},
                 {"role": "assistant", "content": "Yo"}],
    "no_assistant": [{"role": "user", "content": "Only a question"}],
}
# Conversation-level extras (tools list for the instruct-style template's system prompt).
EXTRA = {"tools": {"tools": TOOLS}}


def main():
    env = make_env()
    templates = {}
    for name in sorted(os.listdir(TDIR)):
        if name.endswith(".jinja"):
            with open(os.path.join(TDIR, name), encoding="utf-8") as f:
                src = f.read()
            if name == "chatml.jinja":
                src = src.rstrip("\n")
            templates[name[:-6]] = (src, env.from_string(src))
    renders = []
    for tname, (src, tmpl) in templates.items():
        for cname, conv in CONVERSATIONS.items():
            if tname == "chatml" and any(m.get("content") is None for m in conv):
                continue  # ChatML concatenates content with +; None would be a TypeError in Python too
            extra = EXTRA.get(cname, {})
            for agp in (False, True):
                row = {"template": tname, "conversation": cname, "add_generation_prompt": agp}
                try:
                    text, spans = render(tmpl, conv, agp, extra)
                    row["text"], row["generation_spans"] = text, spans
                except Exception as e:  # noqa: BLE001 - the golden records which inputs must fail
                    row["error"] = str(e)
                renders.append(row)
    # Prefix renders for the label rule (docs/reference/sft_pipeline.md 1.4, MaxText "prefix" rule = open-instruct's).
    labels = []
    for tname in ("olmo3_think", "olmo3_instruct"):
        tmpl = templates[tname][1]
        for cname, conv in CONVERSATIONS.items():
            extra = EXTRA.get(cname, {})
            row = {"template": tname, "conversation": cname}
            try:
                row["full"] = render(tmpl, conv, False, extra)[0]
                turns = []
                for i, m in enumerate(conv):
                    if m["role"] != "assistant":
                        continue
                    header = render(tmpl, conv[:i], True, extra)[0] if i > 0 else ""
                    through = render(tmpl, conv[:i + 1], False, extra)[0]
                    content = (m.get("content") or "") + (m.get("function_calls") or "")
                    turns.append({"index": i, "header": header, "through": through, "content": content,
                                  "later": [(x.get("content") or "") for x in conv[i + 1:]]})
                row["turns"] = turns
            except Exception as e:  # noqa: BLE001
                row["error"] = str(e)
            labels.append(row)
    out = {"generator": "tests/reference/tok_templates.py (Python jinja2 %s)" % jinja2.__version__,
           "eos_token": "<|endoftext|>", "conversations": CONVERSATIONS, "extra": EXTRA,
           "renders": renders, "labels": labels}
    path = os.path.join(ROOT, "tests/golden/tok/templates.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %d renders, %d label rows to %s" % (len(renders), len(labels), path))


if __name__ == "__main__":
    main()
