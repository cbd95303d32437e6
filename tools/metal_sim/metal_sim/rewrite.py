"""Source rewriting: preprocessed MSL -> C++ for the shim.

Works on `clang -E` output. Only text from the project's own files is
rewritten (line markers tell which file a line came from; the shim and
libc++ are system headers). Every rewrite keeps the line structure, so
clang's diagnostics and the debug line tables still name .metal lines.

Rewrites:
* float literals: unsuffixed -> float (`1.5` -> `1.5f`), `1.5h` -> half,
  `1.5bf` -> bfloat;
* vector constructors `float4(a, b)`, `vec<T, 4>(x)` -> `make_vec<...>(...)`
  (clang's own vector casts would reinterpret bits); `half(x)`, `bfloat(x)`,
  `static_cast<half/bfloat>(x)` -> `convert_element` (half <-> bfloat);
* `threadgroup T name[N];` inside functions -> a reference to one array per
  threadgroup;
* `[[function_constant(i)]]` globals -> initialised from the dispatch (the
  attribute may stand on the next line);
* classes defined at namespace or class scope get MSIM_CROSS_SPACE_ASSIGNMENT
  (assignment between address spaces, see msim/address_spaces.h);
* kernels (`[[kernel]]` functions and `[[host_name]]` instantiations) ->
  generated entry points that bind parameters by their attributes;
* all remaining `[[...]]` attributes are removed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

BUILTINS = {
    "thread_position_in_grid",
    "thread_position_in_threadgroup",
    "threadgroup_position_in_grid",
    "threads_per_threadgroup",
    "threadgroups_per_grid",
    "threads_per_grid",
    "thread_index_in_threadgroup",
    "thread_index_in_simdgroup",
    "simdgroup_index_in_threadgroup",
    "threads_per_simdgroup",
    "simdgroups_per_threadgroup",
    "thread_index_in_quadgroup",
    "quadgroup_index_in_threadgroup",
}

LINE_MARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"(.*)$')
STRING_OR_CHAR = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
PP_NUMBER = re.compile(r"(?<![\w.])\.?\d(?:[eEpP][+-]|[\w.])*")
DECIMAL_FLOAT = re.compile(r"((?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)([a-zA-Z]*)")
SCALARS = "bool|char|uchar|short|ushort|int|uint|long|ulong|half|bfloat|float"
VECTOR_CONSTRUCTOR = re.compile(rf"(?<![\w:.])(?:metal::)?((?:packed_)?(?:{SCALARS})[234])\s*\(")
# half <-> bfloat: clang refuses the direct conversion; Metal's `bfloat(h)`
# and `static_cast<half>(b)` go through convert_element (via float, exact),
# also when they name the type through a typedef (MLX's `bfloat16_t`).
HALF_TYPES = ("half", "bfloat")
HALF_ALIAS = re.compile(
    r"\btypedef\s+(?:metal::)?(?:half|bfloat)\s+(\w+)\s*;"
    r"|\busing\s+(\w+)\s*=\s*(?:metal::)?(?:half|bfloat)\s*;"
)


def scalar_cast(names: tuple[str, ...]) -> re.Pattern[str]:
    """`name(` and `static_cast<name>(` for the half and bfloat type names."""
    alternatives = "|".join(names)
    return re.compile(
        rf"(?<![\w:.])(?:(?:metal::)?({alternatives})|static_cast\s*<\s*(?:metal::)?({alternatives})\s*>)"
        r"\s*\((?!\s*[&*])"
    )


SCALAR_CAST = scalar_cast(HALF_TYPES)
VEC_TEMPLATE = re.compile(r"(?<![\w:.])(?:metal::)?vec\s*<")
CONVERSION_FUNCTION = re.compile(r"\boperator\s*$")


def names_conversion_function(code: str, index: int) -> bool:
    """Whether the type name at `index` follows `operator` (`operator half()`)."""
    return CONVERSION_FUNCTION.search(code[max(0, index - 32) : index]) is not None


# `constant const int64_t strides[2]` as a parameter: Metal's array
# parameter is a pointer into that address space.
ARRAY_PARAMETER = re.compile(
    r"(?<=[(,])(?P<declaration>\s*(?:const\s+)?(?:device|constant|threadgroup)\b[^(),;{}\[\]]*?\w)"
    r"\s*(?P<name>\b\w+)\s*\[[^\]]*\](?=\s*[,)])"
)
THREADGROUP_DECLARATION = re.compile(
    r"(?<=[;{}])(?P<before>\s*)threadgroup\s+(?P<type>[^;{}()=\[\]]*?[^;{}()=\[\]*&\s])\s+"
    r"(?P<name>\w+)\s*(?P<dims>(?:\[[^\]]*\]\s*)*);"
)
FUNCTION_CONSTANT = re.compile(r"(\w+)\s*\[\[\s*function_constant\s*\(\s*(\w+)\s*\)\s*\]\]")
CLASS_HEAD = re.compile(
    r"(?<![\w.:])(?:struct|class|union)\s+(?:(?:\[\[[^\]]*\]\]|alignas\s*\((?:[^()]|\([^()]*\))*\))\s*)*"
    r"\w+\s*(?:<[^;{}]*>\s*)?(?:final\s*)?(?::(?!:)[^;{}]*)?\{"
)
NAMESPACE_HEAD = re.compile(r"\bnamespace\b|^extern\s*\"C")
CONSTANT_DEFINED = re.compile(r"\bis_function_constant_defined\s*\(\s*(\w+)\s*\)")
ATTRIBUTE = re.compile(r"\[\[.*?\]\]", re.S)
HOST_NAME = (
    r'\[\[\s*host_name\s*\(\s*((?:"[^"]*"\s*)+)\)\s*\]\]\s*'  # adjacent literals concatenate
)
INSTANTIATION = re.compile(rf"\btemplate\s*{HOST_NAME}(?:\[\[\s*kernel\s*\]\]\s*)?decltype\s*\(")
KERNEL_DEFINITION = re.compile(
    rf"(?:{HOST_NAME})?(?:\[\[\s*kernel\s*\]\]|\bkernel\b)\s*void\s+(\w+)\s*\("
)
PARAMETER_ATTRIBUTE = re.compile(r"\[\[\s*(\w+)\s*(?:\(\s*([^)]*?)\s*\))?\s*(?:,[^\]]*)?\]\]")
ACCESS_SPECIFIERS = re.compile(r"^\s*(?:(?:public|private|protected)\s*:\s*)*")
THREAD_TWIN = r"(?: ?thread\b)?(?=[{:;=]| ?noexcept)"  # after a qualified member's head
# `) const device {`: a member function for objects in another address space.
SPACE_QUALIFIED_MEMBER = re.compile(
    r"\)(?P<const>\s*const)?\s*\b(?P<space>device|threadgroup|constant)\b(?=\s*(?:[{:;=]|noexcept\b))"
)


class RewriteError(Exception):
    """The source uses something the simulator cannot translate."""


def matching(text: str, open_index: int) -> int:
    """Index just past the bracket that closes the one at `open_index`."""
    pairs = {"(": ")", "[": "]", "{": "}", "<": ">"}
    opener = text[open_index]
    closer = pairs[opener]
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == opener:
            depth += 1
        elif text[i] == closer:
            depth -= 1
            if depth == 0:
                return i + 1
    raise RewriteError(f"unbalanced {opener!r} in {text[open_index : open_index + 80]!r}")


def split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def keep_lines(original: str, replacement: str) -> str:
    """`replacement` followed by as many newlines as `original` had."""
    return replacement + "\n" * original.count("\n")


def code_spans(text: str, rewrite: Callable[[str], str]) -> str:
    """Applies `rewrite` to the text between string and character literals."""
    out, last = [], 0
    for literal in STRING_OR_CHAR.finditer(text):
        out.append(rewrite(text[last : literal.start()]))
        out.append(literal.group())
        last = literal.end()
    out.append(rewrite(text[last:]))
    return "".join(out)


def rewrite_float_literal(match: re.Match[str]) -> str:
    token = match.group()
    if token.lower().startswith("0x"):
        return token
    parts = DECIMAL_FLOAT.fullmatch(token)
    if parts is None:
        return token
    number, suffix = parts.groups()
    if suffix == "":
        return number + "f"
    if suffix in ("h", "H"):
        return number + "f16"
    if suffix in ("bf", "BF"):
        return f"((bfloat){number}f)"
    return token


def rewrite_vector_constructors(code: str, scalar_casts: re.Pattern[str] = SCALAR_CAST) -> str:
    def cast(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if names_conversion_function(code, m.start()):
            return m.group()
        return f"::metal::convert_element<{'::' if name in HALF_TYPES else ''}{name}>("

    code = scalar_casts.sub(cast, code)
    code = VECTOR_CONSTRUCTOR.sub(lambda m: f"::metal::make_vec<::{m.group(1)}>(", code)
    out, last = [], 0
    for m in VEC_TEMPLATE.finditer(code):
        if m.start() < last or names_conversion_function(code, m.start()):
            continue
        close = matching(code, m.end() - 1)
        after = re.match(r"\s*\(", code[close:])
        if after is None:
            continue
        out.append(code[last : m.start()])
        out.append(f"::metal::make_vec<::metal::vec{code[m.end() - 1 : close]}>(")
        last = close + after.end()
    out.append(code[last:])
    return "".join(out)


def rewrite_threadgroup_declaration(match: re.Match[str]) -> str:
    kind, name, dims = match.group("type"), match.group("name"), match.group("dims").strip()
    return (
        f"{match.group('before')}threadgroup {kind} (&{name}){dims} = "
        f"::msim::threadgroup_array<{kind} {dims}>([] {{}});"
    )


def parameter_bindings(parameters: list[str], function_type: str) -> list[str]:
    """Argument expressions binding each kernel parameter by its attribute.

    A parameter without an attribute is a buffer with the next unused index,
    as Metal assigns them.
    """
    attributes = [PARAMETER_ATTRIBUTE.search(p) for p in parameters]
    explicit = {int(a.group(2)) for a in attributes if a and a.group(1) == "buffer"}
    implicit = (i for i in range(len(parameters) + len(explicit) + 1) if i not in explicit)
    bindings = []
    for position, (parameter, attribute) in enumerate(zip(parameters, attributes, strict=True)):
        declared = f"::msim::parameter_t<{function_type}, {position}>"
        name, argument = attribute.groups() if attribute else ("buffer", str(next(implicit)))
        if name == "buffer":
            bindings.append(f"::msim::bind_buffer<{declared}>(::msim::buffer_address({argument}))")
        elif name == "threadgroup":
            bindings.append(
                f"::msim::bind_buffer<{declared}>(::msim::threadgroup_buffer_address({argument}))"
            )
        elif name in BUILTINS:
            bindings.append(f"::msim::bind_builtin<{declared}>(::msim::Builtin::{name})")
        else:
            raise RewriteError(
                f"unsupported kernel parameter attribute [[{name}]] in {parameter!r}"
            )
    return bindings


class TranslationUnit:
    """Rewrites one preprocessed translation unit; `kernels` lists its host names."""

    def __init__(self, preprocessed: str) -> None:
        self.lines = preprocessed.split("\n")
        self.kernels: list[str] = []
        self.constant_indices: dict[str, str] = {}
        self.text = self.rewrite()

    def user_chunks(self) -> Iterator[tuple[int, int]]:
        """(first, end) line ranges that come from the project's files."""
        first, user = 0, False
        for i, line in enumerate(self.lines + ['# 1 "<end>" 3']):
            marker = LINE_MARKER.match(line)
            if marker is None:
                continue
            if user and first < i:
                yield first, i
            name, flags = marker.group(2), marker.group(3).split()
            user = "3" not in flags and not name.startswith("<")
            first = i + 1

    def rewrite(self) -> str:
        chunks = list(self.user_chunks())
        texts = ["\n".join(self.lines[a:b]) for a, b in chunks]
        definitions = "\n".join(texts)
        aliases = [a or b for a, b in HALF_ALIAS.findall(definitions)]
        self.scalar_casts = scalar_cast((*HALF_TYPES, *aliases))
        for text in texts:
            for m in FUNCTION_CONSTANT.finditer(text):
                self.constant_indices[m.group(1)] = m.group(2)
        rewritten = [self.rewrite_chunk(text, definitions) for text in texts]
        for (a, b), text in zip(chunks, rewritten, strict=True):
            replacement = text.split("\n")
            assert len(replacement) == b - a, "rewrite changed the line count"
            self.lines[a:b] = replacement
        return "\n".join(self.lines)

    def rewrite_chunk(self, text: str, definitions: str) -> str:
        text = self.generate_entries(text, definitions)
        text = FUNCTION_CONSTANT.sub(
            lambda m: keep_lines(
                m.group(),
                f"{m.group(1)} = ::msim::function_constant<decltype({m.group(1)})>({m.group(2)})",
            ),
            text,
        )
        text = drop_space_qualified_members(text)
        text = add_cross_space_assignment(text)
        text = CONSTANT_DEFINED.sub(self.constant_defined, text)
        text = code_spans(text, self.rewrite_code)
        return ATTRIBUTE.sub(lambda m: keep_lines(m.group(), ""), text)

    def constant_defined(self, match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in self.constant_indices:
            raise RewriteError(
                f"is_function_constant_defined({name}): {name} is not a function constant"
            )
        return f"::msim::function_constant_defined({self.constant_indices[name]})"

    def rewrite_code(self, code: str) -> str:
        code = PP_NUMBER.sub(rewrite_float_literal, code)
        code = rewrite_vector_constructors(code, self.scalar_casts)
        code = ARRAY_PARAMETER.sub(lambda m: f"{m.group('declaration')}* {m.group('name')}", code)
        return THREADGROUP_DECLARATION.sub(rewrite_threadgroup_declaration, code)

    def entry(self, host_name: str, function: str, parameters: list[str]) -> str:
        number = len(self.kernels)
        function_type = f"decltype({function})"
        arguments = ", ".join(parameter_bindings(parameters, function_type))
        code = (
            f"static void msim_kernel_{number}() {{ {function}({arguments}); }} "
            f"static ::msim::KernelRegistration msim_registration_{number}"
            f'("{host_name}", &msim_kernel_{number});'
        )
        self.kernels.append(host_name)
        return code

    def generate_entries(self, text: str, definitions: str) -> str:
        out, last = [], 0
        events = sorted(
            [(m.start(), "instantiation", m) for m in INSTANTIATION.finditer(text)]
            + [(m.start(), "definition", m) for m in KERNEL_DEFINITION.finditer(text)],
            key=lambda e: e[0],
        )
        for start, kind, m in events:
            if start < last:
                continue
            if kind == "instantiation":
                close = matching(text, m.end() - 1)
                function = text[m.end() : close - 1].strip()
                end = text.index(";", close) + 1
                name = re.sub(r"\s+", "", function.split("<")[0]).split("::")[-1]
                code = self.entry(
                    host_name(m.group(1)), function, kernel_parameters(name, definitions)
                )
                out += [text[last:start], keep_lines(text[start:end], code)]
            elif text[:start].rstrip().endswith(">"):
                continue  # a kernel template: its instantiations are the entry points
            else:
                params_close = matching(text, m.end() - 1)
                body = text.index("{", params_close)
                end = matching(text, body)
                name = m.group(2)
                parameters = split_top_level(text[m.end() : params_close - 1])
                code = self.entry(host_name(m.group(1)) if m.group(1) else name, name, parameters)
                out += [text[last:end], " ", code]
            last = end
        out.append(text[last:])
        return "".join(out)


def normalized(code: str) -> str:
    """`code` without the whitespace that does not separate two words."""
    return re.sub(r" ?([^\w ]) ?", r"\1", re.sub(r"\s+", " ", code)).strip()


def enclosing_body(code: str, index: int) -> tuple[int, int]:
    """(start, end) of the innermost {...} around `index` (the whole text at top level)."""
    depth = 0
    for i in range(index - 1, -1, -1):
        if code[i] == "}":
            depth += 1
        elif code[i] == "{":
            if depth == 0:
                return i, matching(code, i)
            depth -= 1
    return 0, len(code)


def definition_end(code: str, index: int) -> int:
    """End of the member declaration whose qualifier ends at `index`: past its body
    (after a constructor's initializer list, with a `;` after it) or its `;`."""
    depth = 0
    for i in range(index, len(code)):
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and c == ";":
            return i + 1
        elif depth == 0 and c == "{" and re.search(r"(?:[)}]|^:?|\bnoexcept)\s*$", code[index:i]):
            end = matching(code, i)
            semicolon = re.match(r"\s*;", code[end:])  # `{};`
            return end + semicolon.end() if semicolon else end
    raise RewriteError(f"no end of the member declared at {code[index - 80 : index]!r}")


def drop_space_qualified_members(text: str) -> str:
    """Member functions qualified `device`, `threadgroup` or `constant`.

    C++ has no address-space-qualified `this`: a qualified member that repeats
    a `thread` (or unqualified) member of its class is dropped, any other
    loses its qualifier and serves objects in the generic space.
    """
    code = STRING_OR_CHAR.sub(lambda m: "_" * len(m.group()), text)
    edits: list[tuple[int, int, str]] = []
    for m in SPACE_QUALIFIED_MEMBER.finditer(code):
        if edits and m.start() < edits[-1][1]:
            continue
        body_start, body_end = enclosing_body(code, m.start())
        head_start = max(code.rfind(c, body_start, m.start()) for c in ";{}") + 1
        head = ACCESS_SPECIFIERS.sub("", code[head_start : m.start() + 1])
        twin = re.escape(normalized(head + (m.group("const") or ""))) + THREAD_TWIN
        if re.search(twin, normalized(code[body_start:body_end])):
            end = definition_end(code, m.end())
            edits.append((head_start, end, keep_lines(text[head_start:end], "")))
        else:
            edits.append((m.start("space"), m.end("space"), " " * len(m.group("space"))))
    out, last = [], 0
    for start, end, replacement in edits:
        out += [text[last:start], replacement]
        last = end
    out.append(text[last:])
    return "".join(out)


def add_cross_space_assignment(text: str) -> str:
    """Puts MSIM_CROSS_SPACE_ASSIGNMENT into each class defined at namespace or class scope.

    (Local classes cannot have member templates; they keep generic-space
    assignment only.)
    """
    code = STRING_OR_CHAR.sub(lambda m: "_" * len(m.group()), text)
    heads = {m.end(): m for m in CLASS_HEAD.finditer(code)}
    out, last, scopes, statement = [], 0, [], 0
    for m in re.finditer(r"[{};]", code):
        i, c = m.start(), m.group()
        if c == "{":
            head = code[statement:i].strip()
            class_head = heads.get(i + 1)
            if class_head and re.search(
                r"\benum\s*$", code[max(0, class_head.start() - 16) : class_head.start()]
            ):
                class_head = None
            if class_head and all(scopes):
                out += [text[last : i + 1], " MSIM_CROSS_SPACE_ASSIGNMENT "]
                last = i + 1
            scopes.append(class_head is not None or bool(NAMESPACE_HEAD.search(head)))
        elif c == "}" and scopes:
            scopes.pop()
        statement = i + 1
    out.append(text[last:])
    return "".join(out)


def host_name(literals: str) -> str:
    return "".join(re.findall(r'"([^"]*)"', literals))


def kernel_parameters(name: str, definitions: str) -> list[str]:
    """Parameter declarations of the kernel template `name` (the one with attributes)."""
    for m in re.finditer(rf"\b{re.escape(name)}\s*\(", definitions):
        close = matching(definitions, m.end() - 1)
        inside = definitions[m.end() : close - 1]
        if "[[" in inside and re.match(r"\s*(?:\[\[[^\]]*\]\]\s*)*\{", definitions[close:]):
            return split_top_level(inside)
    raise RewriteError(
        f"no definition with [[buffer(n)]]-style parameters found for kernel template {name}"
    )
