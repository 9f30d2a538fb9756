#!/usr/bin/env python3
"""Renders every case of cases.json with Python's Jinja2 set up as Hugging Face transformers sets
it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the HF `tojson`,
`raise_exception`, `strftime_now`, `{% generation %}`), and writes expected/<name>.txt.

These files are the goldens of tests/suite/templates.rs: pdgate's minijinja renderer must produce the
same bytes as the reference renderer. Messages are reshaped the way the crate documents (text
parts joined with a space for "string" templates, tool-call argument strings parsed) before
rendering, so the goldens compare the renderers, not the reshaping.

    python3 tokenize/tests/golden/render_with_jinja2.py   # Jinja2 3.1.x
"""
import datetime
import json
import pathlib

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = pathlib.Path(__file__).parent


class AssistantTracker(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def reshape(messages, content_format):
    out = []
    for m in messages:
        m = dict(m)
        if content_format == "string" and isinstance(m.get("content"), list):
            m["content"] = " ".join(p["text"] for p in m["content"] if p.get("type") == "text")
        if isinstance(m.get("tool_calls"), list):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c)
                f = dict(c.get("function", {}))
                if isinstance(f.get("arguments"), str):
                    try:
                        f["arguments"] = json.loads(f["arguments"])
                    except ValueError:
                        pass
                c["function"] = f
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


def main():
    spec = json.loads((HERE / "cases.json").read_text())
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    for case in spec["cases"]:
        template = env.from_string((HERE / "templates" / case["template"]).read_text())
        ctx = {
            "messages": reshape(case["messages"], case["content_format"]),
            "add_generation_prompt": case.get("add_generation_prompt", False),
        }
        if "tools" in case:
            ctx["tools"] = spec["tools"][case["tools"]]
        if "documents" in case:
            ctx["documents"] = case["documents"]
        for token in ("bos_token", "eos_token"):
            if token in case:
                ctx[token] = case[token]
        ctx.update(case.get("kwargs", {}))
        try:
            text = template.render(**ctx)
        except jinja2.exceptions.TemplateError as e:
            text = "RAISE: " + str(e)
        (HERE / "expected" / (case["name"] + ".txt")).write_text(text)
        print(case["name"], len(text))


if __name__ == "__main__":
    main()
