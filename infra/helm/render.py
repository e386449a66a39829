"""Render a Helm chart offline, for the subset of Go templates our chart uses (no helm binary needed).

Why: ``helm`` is not installable from the registries the development machines and CI reach (PyPI,
Debian, npm), so ``helm template`` cannot run in the test suite.  This renders the same chart files
(Chart.yaml, values.yaml, templates/*.yaml, templates/_*.tpl) the way ``helm template`` does for the
constructs below, and refuses anything else with a `TemplateError` naming the file and the action, so
the chart cannot drift into syntax this renderer would get wrong.  With a real helm,
``helm template RELEASE infra/helm/render-broker`` renders the same chart.

Supported (Go text/template + the Sprig/Helm functions listed in FUNCS):
- ``{{ pipeline }}``, ``{{- ... -}}`` whitespace trimming, ``{{/* comments */}}``;
- ``if`` / ``else if`` / ``else`` / ``end``, ``range $v := X``, ``range $i, $v := X``, ``range X``,
  ``with X``, ``define "name"`` (in ``_*.tpl``) and ``include "name" ctx``;
- operands: ``.`` and ``.A.b`` (the current context), ``$`` and ``$x.a`` (variables), ``"strings"``,
  integers, ``true``/``false``, parenthesised pipelines; pipes ``x | f a`` pass ``x`` as the last argument.
Values merge like ``helm -f``: maps deep-merge, anything else is replaced; like helm, the merged values
must satisfy the chart's ``values.schema.json`` (JSON Schema draft 7, checked with ``jsonschema``).

    python infra/helm/render.py infra/helm/render-broker [--values FILE]... [--release NAME] [--namespace NS]
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    """A construct outside the supported subset, or a render-time failure (``required``, ``fail``)."""


# --- values --------------------------------------------------------------------------------------------


def merge_values(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``helm -f``: maps merge key by key, recursively; other values (lists too) are replaced."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge_values(out[k], v)
        else:
            out[k] = v
    return out


# --- functions -----------------------------------------------------------------------------------------


def go_str(v: Any) -> str:
    """How text/template prints a value."""
    if v is None:
        return ""  # Go prints "<no value>" for a missing key; Helm's engine replaces that with ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        raise TemplateError(f"printing a {type(v).__name__} directly; use toYaml")
    return str(v)


def truthy(v: Any) -> bool:
    """text/template's truth: false, 0, nil and empty strings/lists/maps are false."""
    return not (v is None or v is False or v == 0 or (hasattr(v, "__len__") and len(v) == 0))


def to_yaml(v: Any) -> str:
    if v is None or v == {} or v == []:
        return "{}" if isinstance(v, dict) else ("[]" if isinstance(v, list) else "null")
    return str(yaml.safe_dump(v, default_flow_style=False, sort_keys=True)).rstrip("\n")


def indent(n: int, s: str) -> str:
    pad = " " * int(n)
    return "\n".join(pad + line for line in str(s).split("\n"))


def required(msg: str, v: Any) -> Any:
    if v is None or v == "":
        raise TemplateError(f"required value missing: {msg}")
    return v


def fail(msg: str) -> Any:
    raise TemplateError(f"fail: {msg}")


def printf(fmt: str, *args: Any) -> str:
    # the verbs our chart uses: %s, %d, %v
    return re.sub(r"%[sdv]", "{}", fmt).format(*(go_str(a) for a in args))


FUNCS: dict[str, Callable[..., Any]] = {
    "quote": lambda v: json.dumps(go_str(v) if v is not None else ""),
    "squote": lambda v: "'" + go_str(v) + "'",
    "toYaml": to_yaml,
    "toJson": lambda v: json.dumps(v, sort_keys=True, separators=(",", ":")),
    "indent": indent,
    "nindent": lambda n, s: "\n" + indent(n, s),
    "default": lambda d, v=None: v if truthy(v) else d,
    "required": required,
    "fail": fail,
    "b64enc": lambda v: base64.b64encode(go_str(v).encode()).decode(),
    "printf": printf,
    "lower": lambda v: go_str(v).lower(),
    "upper": lambda v: go_str(v).upper(),
    "trunc": lambda n, v: go_str(v)[: int(n)],
    "trimSuffix": lambda suf, v: go_str(v).removesuffix(suf),
    "add": lambda *a: sum(int(x) for x in a),
    "int": lambda v: int(float(v)),
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "not": lambda v: not truthy(v),
    "and": lambda *a: next((x for x in a if not truthy(x)), a[-1]),
    "or": lambda *a: next((x for x in a if truthy(x)), a[-1]),
    "join": lambda sep, v: sep.join(go_str(x) for x in v),
    "list": lambda *a: list(a),
    "dict": lambda *a: {a[i]: a[i + 1] for i in range(0, len(a), 2)},
    "hasKey": lambda d, k: k in d,
}


# --- parsing -------------------------------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-?)(\s*/\*.*?\*/\s*|.*?)(-?)\}\}", re.S)
_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?\d+)|(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)'
                    r"|(?P<field>\.(?:[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*)?)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<op>:=|[|(),=]))")


@dataclass
class Text:
    text: str


@dataclass
class Action:
    expr: list[Any]  # a parsed pipeline
    src: str
    assign: str | None = None  # "$x" for {{ $x := pipeline }} (prints nothing)


@dataclass
class Block:
    kind: str  # if | range | with | define
    head: str  # the action text
    branches: list[tuple[Any, list[Any]]] = field(default_factory=list)  # (condition pipeline or None, body)
    var_names: list[str] = field(default_factory=list)


def tokenize(src: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    src = src.strip()
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"cannot parse {src[pos:]!r} in {{{{ {src} }}}}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(src) and src[pos].isspace():
            pos += 1
    return out


def parse_pipeline(tokens: list[tuple[str, str]], src: str) -> list[list[Any]]:
    """A pipeline: commands separated by '|'; each command a list of operands (a nested pipeline for '(')."""
    pos = 0

    def operand() -> Any:
        nonlocal pos
        kind, val = tokens[pos]
        pos += 1
        if kind == "op" and val == "(":
            inner = pipeline()
            if pos >= len(tokens) or tokens[pos] != ("op", ")"):
                raise TemplateError(f"unbalanced parenthesis in {{{{ {src} }}}}")
            pos += 1
            return ("pipe", inner)
        if kind == "op":
            raise TemplateError(f"unexpected {val!r} in {{{{ {src} }}}}")
        return (kind, val)

    def pipeline() -> list[list[Any]]:
        nonlocal pos
        cmds: list[list[Any]] = [[]]
        while pos < len(tokens) and tokens[pos] != ("op", ")"):
            if tokens[pos] == ("op", "|"):
                pos += 1
                cmds.append([])
                continue
            cmds[-1].append(operand())
        if any(not c for c in cmds):
            raise TemplateError(f"empty command in {{{{ {src} }}}}")
        return cmds

    cmds = pipeline()
    if pos != len(tokens):
        raise TemplateError(f"unexpected {tokens[pos][1]!r} in {{{{ {src} }}}}")
    return cmds


def parse(text: str, name: str) -> tuple[list[Any], dict[str, list[Any]]]:
    """(nodes, defines) of one template file."""
    pieces: list[Any] = []
    pos = 0
    for m in _ACTION.finditer(text):
        before = text[pos:m.start()]
        if m.group(1):
            before = before.rstrip()
        pieces.append(Text(before))
        pieces.append(m.group(2).strip())
        pos = m.end()
        if m.group(3):
            while pos < len(text) and text[pos].isspace():
                pos += 1
    pieces.append(Text(text[pos:]))

    defines: dict[str, list[Any]] = {}
    root: list[Any] = []
    stack: list[tuple[Block, list[Any]]] = []  # (block, the body being filled)
    body = root
    for p in pieces:
        if isinstance(p, Text):
            if p.text:
                body.append(p)
            continue
        if p.startswith("/*"):
            continue
        word = p.split(None, 1)[0] if p else ""
        rest = p[len(word):].strip()
        if word in ("if", "range", "with", "define"):
            blk = Block(word, p)
            cond: Any = rest
            if word == "range":
                m2 = re.fullmatch(r"(\$\w+)(?:\s*,\s*(\$\w+))?\s*:=\s*(.+)", rest, re.S)
                if m2:
                    blk.var_names = [v for v in (m2.group(1), m2.group(2)) if v]
                    cond = m2.group(3)
            if word == "define":
                m3 = re.fullmatch(r'"([^"]+)"', rest)
                if not m3:
                    raise TemplateError(f"{name}: bad define {p!r}")
                blk.head = m3.group(1)
                cond = None
            else:
                cond = parse_pipeline(tokenize(cond), p)
            new_body: list[Any] = []
            blk.branches.append((cond, new_body))
            body.append(blk)
            stack.append((blk, body))
            body = new_body
        elif word == "else":
            if not stack or stack[-1][0].kind not in ("if", "with", "range"):
                raise TemplateError(f"{name}: else outside if/with/range")
            blk = stack[-1][0]
            cond = True
            if rest.startswith("if "):
                if blk.kind != "if":
                    raise TemplateError(f"{name}: else if inside {blk.kind}")
                cond = parse_pipeline(tokenize(rest[3:]), p)
            body = []
            blk.branches.append((cond, body))
        elif word == "end":
            if not stack:
                raise TemplateError(f"{name}: end without a block")
            blk, body = stack.pop()
            if blk.kind == "define":
                body.remove(blk)
                defines[blk.head] = blk.branches[0][1]
        elif word in ("template", "block", "break", "continue", "tpl"):
            raise TemplateError(f"{name}: {{{{ {p} }}}} is outside the supported subset")
        else:
            m4 = re.fullmatch(r"(\$\w+)\s*:=\s*(.+)", p, re.S)
            if m4:
                body.append(Action(parse_pipeline(tokenize(m4.group(2)), p), p, assign=m4.group(1)))
            else:
                body.append(Action(parse_pipeline(tokenize(p), p), p))
    if stack:
        raise TemplateError(f"{name}: {stack[-1][0].kind} without end")
    return root, defines


# --- evaluation ----------------------------------------------------------------------------------------


class Renderer:
    def __init__(self, defines: dict[str, list[Any]]) -> None:
        self.defines = defines

    def lookup(self, base: Any, path: list[str], src: str) -> Any:
        v = base
        for i, part in enumerate(path):
            if v is None:
                # Go: a missing last key is "no value", but a field of a missing key is an error
                raise TemplateError(f"nil pointer evaluating .{'.'.join(path[:i])}.{part} in {{{{ {src} }}}}")
            if not isinstance(v, Mapping):
                raise TemplateError(f"cannot take .{part} of a {type(v).__name__} in {{{{ {src} }}}}")
            v = v.get(part)
        return v

    def operand(self, op: Any, dot: Any, scope: dict[str, Any], src: str) -> Any:
        kind, val = op
        if kind == "str":
            return json.loads(val)
        if kind == "num":
            return int(val)
        if kind == "field":
            return dot if val == "." else self.lookup(dot, val[1:].split("."), src)
        if kind == "var":
            name, *path = val.split(".")
            if name not in scope:
                raise TemplateError(f"undefined variable {name} in {{{{ {src} }}}}")
            return self.lookup(scope[name], path, src)
        if kind == "pipe":
            return self.pipeline(val, dot, scope, src)
        if kind == "ident":
            if val in ("true", "false"):
                return val == "true"
            if val == "nil":
                return None
            return self.call(val, [], dot, scope, src)
        raise TemplateError(f"cannot evaluate {val!r} in {{{{ {src} }}}}")

    def call(self, fn: str, args: list[Any], dot: Any, scope: dict[str, Any], src: str) -> Any:
        if fn == "include":
            name, ctx = args
            if name not in self.defines:
                raise TemplateError(f"include of undefined template {name!r}")
            return self.render(self.defines[name], ctx, {"$": ctx})
        if fn not in FUNCS:
            raise TemplateError(f"function {fn!r} is outside the supported subset ({{{{ {src} }}}})")
        try:
            return FUNCS[fn](*args)
        except TemplateError:
            raise
        except Exception as exc:
            raise TemplateError(f"{fn}: {exc} in {{{{ {src} }}}}") from exc

    def pipeline(self, cmds: list[list[Any]], dot: Any, scope: dict[str, Any], src: str) -> Any:
        result: Any = None
        for i, cmd in enumerate(cmds):
            head = cmd[0]
            if head[0] == "ident" and head[1] not in ("true", "false", "nil"):
                args = [self.operand(a, dot, scope, src) for a in cmd[1:]]
                if i > 0:
                    args.append(result)
                result = self.call(head[1], args, dot, scope, src)
            else:
                if len(cmd) > 1 or i > 0:
                    raise TemplateError(f"{{{{ {src} }}}}: only a function can take arguments")
                result = self.operand(head, dot, scope, src)
        return result

    def render(self, nodes: list[Any], dot: Any, scope: dict[str, Any]) -> str:
        out: list[str] = []
        for n in nodes:
            if isinstance(n, Text):
                out.append(n.text)
            elif isinstance(n, Action):
                if n.assign:
                    scope[n.assign] = self.pipeline(n.expr, dot, scope, n.src)
                else:
                    out.append(go_str(self.pipeline(n.expr, dot, scope, n.src)))
            elif isinstance(n, Block):
                out.append(self.block(n, dot, scope))
        return "".join(out)

    def block(self, b: Block, dot: Any, scope: dict[str, Any]) -> str:
        if b.kind == "if":
            for cond, body in b.branches:
                if cond is True or truthy(self.pipeline(cond, dot, scope, b.head)):
                    return self.render(body, dot, dict(scope))
            return ""
        value = self.pipeline(b.branches[0][0], dot, scope, b.head)
        if b.kind == "with":
            if truthy(value):
                return self.render(b.branches[0][1], value, dict(scope))
            return self.render(b.branches[1][1], dot, dict(scope)) if len(b.branches) > 1 else ""
        # range: over a list (index, item) or a map (sorted key, value), as Go does
        items = list(enumerate(value)) if isinstance(value, list) else sorted((value or {}).items())
        if not items:
            return self.render(b.branches[1][1], dot, dict(scope)) if len(b.branches) > 1 else ""
        parts = []
        for k, v in items:
            inner = dict(scope)
            if len(b.var_names) == 1:
                inner[b.var_names[0]] = v
            elif len(b.var_names) == 2:
                inner[b.var_names[0]], inner[b.var_names[1]] = k, v
            parts.append(self.render(b.branches[0][1], v, inner))
        return "".join(parts)


# --- the chart -----------------------------------------------------------------------------------------


def check_schema(chart: Path, values: Mapping[str, Any]) -> None:
    """Like helm: the merged values must satisfy the chart's values.schema.json, when it has one."""
    path = chart / "values.schema.json"
    if not path.exists():
        return
    try:
        import jsonschema
    except ImportError as exc:  # (kubernetes-validate, in the test extra, brings it)
        raise TemplateError("values.schema.json needs the jsonschema package") from exc
    errors = sorted(jsonschema.Draft7Validator(json.loads(path.read_text())).iter_errors(values),
                    key=lambda e: list(e.absolute_path))
    if errors:
        raise TemplateError("values don't meet values.schema.json: " + "; ".join(
            f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors))


def render_chart(chart: Path | str, values: Mapping[str, Any] | None = None, *, release: str = "rb",
                 namespace: str = "default") -> list[tuple[str, dict[str, Any]]]:
    """(template file name, object) for every non-empty YAML document the chart renders."""
    chart = Path(chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    vals = merge_values(yaml.safe_load((chart / "values.yaml").read_text()) or {}, values or {})
    check_schema(chart, vals)
    ctx = {"Values": vals, "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
           "Chart": {"Name": meta["name"], "Version": meta["version"], "AppVersion": meta.get("appVersion", "")}}
    defines: dict[str, list[Any]] = {}
    parsed = []
    for path in sorted((chart / "templates").iterdir()):
        if path.suffix not in (".yaml", ".yml", ".tpl"):
            continue
        nodes, defs = parse(path.read_text(), path.name)
        defines.update(defs)
        if not path.name.startswith("_"):
            parsed.append((path.name, nodes))
    r = Renderer(defines)
    out = []
    for name, nodes in parsed:
        try:
            text = r.render(nodes, ctx, {"$": ctx})
        except TemplateError as exc:
            raise TemplateError(f"{name}: {exc}") from exc
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append((name, doc))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("chart")
    ap.add_argument("--values", "-f", action="append", default=[], help="a values file (repeatable, like helm -f)")
    ap.add_argument("--release", default="rb")
    ap.add_argument("--namespace", default="default")
    a = ap.parse_args(argv)
    vals: dict[str, Any] = {}
    for f in a.values:
        vals = merge_values(vals, yaml.safe_load(Path(f).read_text()) or {})
    try:
        docs = render_chart(a.chart, vals, release=a.release, namespace=a.namespace)
    except TemplateError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 1
    for name, doc in docs:
        print(f"---\n# Source: {Path(a.chart).name}/templates/{name}")
        print(yaml.safe_dump(doc, sort_keys=False).rstrip("\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
