"""LLVM IR pass (on clang's textual IR): traces memory accesses, internalises symbols.

Kernels are compiled to optimised IR, rewritten here, then compiled to an
object with the IR optimisation passes off, so every access the machine code
performs is one this pass saw:

* every `load` and `store` through a `device`, `constant` or `threadgroup`
  pointer (address spaces 1-3) gets a call `__msim_load/__msim_store(address,
  size)` just before it, whatever its width: 32-byte vectors, 3-, 6- or
  12-byte values, aggregates (one call per contiguous run of fields, so
  padding is not touched);
* `llvm.memcpy/memmove/memset` (struct copies) become `__msim_copy`,
  `__msim_load` or `__msim_store` calls on their address-space operands;
* clang writes one component of a vector in memory (`v[i].x = a`) as a load
  of the whole vector, an insertelement/shufflevector and a store of the
  whole vector. Such a store is traced as a write of the replaced
  components only, and its load is not traced, as on a GPU;
* every symbol the module defines becomes internal, as if each .metal file
  were its own program (Metal compiles them separately): program-scope
  `constant` variables and function constants declared in a shared header,
  or non-inline functions, do not collide when several files form one
  Library.

The calls carry the access's debug location, so reports name its line.

It also counts the instructions each thread executes, by class (see
CLASSES): each basic block of a function defined in the kernel's sources
(not in the shim, whose out-of-line functions carry out collectives) starts
with a call `__msim_count(ptr)` to a constant array of its own counts.
Vector operations count once per element, as the GPU's scalar lanes do them;
a device, constant or threadgroup access counts once whatever its width.
Not counted: what the simulator adds (the tracing calls, the runtime calls,
private memory, which on a GPU is registers) and what costs nothing
(phi, bitcast, address-space casts, unconditional branches, debug and
lifetime intrinsics), nor the sanitizer's shift and division checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TRACED_ADDRESS_SPACES = {"1", "2", "3"}  # device, constant, threadgroup
HOOKS = (
    "declare void @__msim_load(i64, i64)\n"
    "declare void @__msim_store(i64, i64)\n"
    "declare void @__msim_copy(i64, i64, i64)\n"
    "declare void @__msim_count(ptr)\n"
)
# Instruction classes, in the order of __msim_count's array (runtime/runtime.h).
CLASSES = ("float", "integer", "conversion", "memory", "control", "other")
FLOAT_TYPES = {"half", "bfloat", "float", "double"}
FLOAT_OPS = {"fadd", "fsub", "fmul", "fdiv", "frem", "fneg", "fcmp"}
INTEGER_OPS = {
    "add", "sub", "mul", "udiv", "sdiv", "urem", "srem", "shl", "lshr", "ashr", "and", "or",
    "xor", "icmp", "trunc", "zext", "sext", "getelementptr",
}  # fmt: skip
CONVERSION_OPS = {"fpext", "fptrunc", "fptoui", "fptosi", "uitofp", "sitofp"}
OTHER_OPS = {"extractelement", "insertelement", "shufflevector", "extractvalue", "insertvalue"}
FLAG_WORDS = {
    "fast", "nnan", "ninf", "nsz", "arcp", "contract", "afn", "reassoc", "nuw", "nsw", "exact",
    "disjoint", "nneg", "samesign", "inbounds", "tail", "musttail", "notail", "noundef",
    "zeroext", "signext", "inreg",
}  # fmt: skip
# Calls to these are the simulator's machinery, not the kernel's work.
UNCOUNTED_CALLS = re.compile(
    r"@(?:llvm\.(?:dbg|lifetime|assume|experimental\.noalias)|_ZN4msim|__msim_|__ubsan_)"
)
INTEGER_INTRINSICS = re.compile(
    r"@llvm\.(?:[us](?:min|max)|abs|ctpop|ctlz|cttz|bswap|bitreverse|fsh[lr])\."
)
LABEL = re.compile(r'^(?:\d+|[-\w.$]+|"[^"]*"):')
SUBPROGRAM = re.compile(r"^(![\w.]+)\s*=\s*distinct\s+!DISubprogram\(.*?\bfile:\s*(![\w.]+)")
DIFILE = re.compile(r'^(![\w.]+)\s*=\s*!DIFile\(filename:\s*"((?:[^"\\]|\\.)*)"')
DEFINE_DEBUG = re.compile(r"!dbg\s+(![\w.]+)\s*\{\s*$")

LINKAGES = (
    "private|internal|available_externally|linkonce_odr|weak_odr|linkonce|weak|common|"
    "appending|extern_weak|external"
)
DEFINE = re.compile(
    rf"^define\s+(?:(?:{LINKAGES})\s+)?(?:(?:dso_local|dso_preemptable)\s+)?"
    r"(?:(?:default|hidden|protected)\s+)?"
)
GLOBAL = re.compile(
    rf"^(?P<name>@(?:[-\w.$]+|\"[^\"]*\"))\s*=\s*(?:(?P<linkage>{LINKAGES})\s+)?"
    r"(?:(?:dso_local|dso_preemptable)\s+)?(?:(?:default|hidden|protected)\s+)?"
)
COMDAT_USE = re.compile(r",?\s*\bcomdat(?:\s*\(\$[^)]*\))?")
COMDAT_DEFINITION = re.compile(r"^\$\S+\s*=\s*comdat\b")
VALUE = r"%(?:[-\w.$]+|\"[^\"]*\")"
LOAD = re.compile(rf"^(?P<indent>\s*)(?P<name>{VALUE})\s*=\s*load\s+(?P<rest>.*)$")
STORE = re.compile(r"^(?P<indent>\s*)store\s+(?P<rest>.*)$")
MEM_INTRINSIC = re.compile(
    r"^(?P<indent>\s*)(?:tail\s+|musttail\s+|notail\s+)?call\s+void\s+"
    r"@llvm\.(?P<op>memcpy|memmove|memset)(?:\.inline)?\.[\w.]+\((?P<args>.*)\)(?P<tail>[^()]*)$"
)
UNTRACEABLE = re.compile(r"@llvm\.(?:masked|vp|experimental\.vp|matrix\.column\.major)\.\w+")
ADDRESS_SPACE_POINTER = re.compile(r"\bptr\s+addrspace\((\d+)\)")
DEBUG_LOCATION = re.compile(r",\s*!dbg\s+(![\w.]+)")
DEFINITION = re.compile(rf"^\s*(?P<name>{VALUE})\s*=\s*(?P<rest>.*)$")


class InstrumentError(Exception):
    """The IR uses a memory operation the simulator cannot trace."""


def split_top_level(text: str) -> list[str]:
    parts, depth, start, quoted = [], 0, 0, False
    for i, c in enumerate(text):
        if c == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def split_type(text: str) -> tuple[str, str]:
    """(leading IR type, rest) of `text`."""
    text = text.strip()
    pairs = {"<": ">", "{": "}", "[": "]"}
    if text[0] in pairs:
        depth = 0
        for i, c in enumerate(text):
            if c in "<{[":
                depth += 1
            elif c in ">}]":
                depth -= 1
                if depth == 0:
                    return text[: i + 1], text[i + 1 :].strip()
        raise InstrumentError(f"unbalanced type in {text!r}")
    m = re.match(r'%(?:[-\w.$]+|"[^"]*")|ptr(?:\s+addrspace\(\d+\))?|\w+', text)
    if m is None:
        raise InstrumentError(f"cannot parse a type in {text!r}")
    return m.group(), text[m.end() :].strip()


# ---------------------------------------------------------------- x86-64 data layout


@dataclass(frozen=True)
class Layout:
    store: int  # bytes a load or store of the type touches (without tail padding)
    size: int  # allocation size (stride in arrays)
    align: int
    leaves: tuple[tuple[int, int], ...]  # (offset, bytes) of the scalars and vectors


SCALARS = {
    "half": (2, 2),
    "bfloat": (2, 2),
    "float": (4, 4),
    "double": (8, 8),
    "fp128": (16, 16),
    "x86_fp80": (10, 16),
    "ptr": (8, 8),
}


def align_to(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def integer_align(bits: int) -> int:
    for width, a in ((8, 1), (16, 2), (32, 4), (64, 8)):
        if bits <= width:
            return a
    return 16


def element_bits(t: str) -> int:
    if re.fullmatch(r"i\d+", t):
        return int(t[1:])
    return SCALARS[t.split()[0]][0] * 8


class DataLayout:
    def __init__(self, module: str) -> None:
        self.named = {
            m.group(1): m.group(2).strip()
            for m in re.finditer(r'^(%(?:[-\w.$]+|"[^"]*"))\s*=\s*type\s+(.*)$', module, re.M)
        }
        self.cache: dict[str, Layout] = {}

    def __call__(self, t: str) -> Layout:
        t = t.strip()
        if t not in self.cache:
            self.cache[t] = self.compute(t)
        return self.cache[t]

    def compute(self, t: str) -> Layout:
        if t.startswith("%"):
            if t not in self.named or self.named[t] == "opaque":
                raise InstrumentError(f"access of opaque type {t}")
            return self(self.named[t])
        if re.fullmatch(r"i\d+", t):
            bits = int(t[1:])
            store, a = (bits + 7) // 8, integer_align(bits)
            return Layout(store, align_to(store, a), a, ((0, store),))
        if t.startswith("ptr"):
            return Layout(8, 8, 8, ((0, 8),))
        if t in SCALARS:
            store, a = SCALARS[t]
            return Layout(store, align_to(store, a), a, ((0, store),))
        if t.startswith("<{"):
            return self.struct(split_top_level(t[2:-2]), packed=True)
        if t.startswith("{"):
            return self.struct(split_top_level(t[1:-1]), packed=False)
        m = re.fullmatch(r"<\s*(\d+)\s+x\s+(.+?)\s*>", t)
        if m:
            store = (int(m.group(1)) * element_bits(m.group(2)) + 7) // 8
            a = 1 << max(store - 1, 0).bit_length()
            return Layout(store, align_to(store, a), a, ((0, store),))
        m = re.fullmatch(r"\[\s*(\d+)\s+x\s+(.+?)\s*\]", t)
        if m:
            n, element = int(m.group(1)), self(m.group(2))
            leaves = tuple((i * element.size + o, b) for i in range(n) for o, b in element.leaves)
            return Layout(n * element.size, n * element.size, element.align, leaves)
        raise InstrumentError(f"cannot lay out IR type {t!r}")

    def struct(self, fields: list[str], packed: bool) -> Layout:
        offset, a, leaves = 0, 1, []
        for field in fields:
            f = self(field)
            if not packed:
                offset = align_to(offset, f.align)
                a = max(a, f.align)
            leaves += [(offset + o, b) for o, b in f.leaves]
            offset += f.size
        size = align_to(offset, a)
        return Layout(size, size, a, tuple(leaves))


def runs(leaves: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Merges adjacent (offset, bytes) leaves into contiguous runs."""
    out: list[list[int]] = []
    for offset, size in sorted(leaves):
        if out and out[-1][0] + out[-1][1] >= offset:
            out[-1][1] = max(out[-1][1], offset + size - out[-1][0])
        else:
            out.append([offset, size])
    return [(o, s) for o, s in out]


# ---------------------------------------------------------------- the pass


@dataclass
class Access:
    index: int  # line
    kind: str  # "load" or "store"
    type: str
    space: str
    pointer: str  # the pointer operand's text (after the type)
    value: str = ""  # stored value
    name: str = ""  # loaded value


def pointer_operand(part: str) -> tuple[str, str] | None:
    """(address space, operand) of a `ptr addrspace(n) [attributes] operand` argument."""
    m = ADDRESS_SPACE_POINTER.match(part)
    if m is None:
        return None
    rest = part[m.end() :].strip()
    # Parameter attributes of intrinsic arguments precede the operand.
    while True:
        a = re.match(
            r"(?:noundef|nonnull|noalias|readonly|writeonly|(?:align|dereferenceable(?:_or_null)?)"
            r"\s*\(?\s*\d+\s*\)?|captures\([^)]*\)|nocapture)\s+",
            rest,
        )
        if a is None:
            break
        rest = rest[a.end() :]
    return m.group(1), rest.strip()


def lanes(type_text: str) -> tuple[int, bool]:
    """(elements, whether floating point) of an IR type's leading vector or scalar."""
    m = re.match(r"<\s*(\d+)\s+x\s+(\w+)", type_text)
    if m:
        return int(m.group(1)), m.group(2) in FLOAT_TYPES
    word = re.match(r"\w+", type_text)
    return 1, bool(word) and word.group() in FLOAT_TYPES


def operand_type(text: str) -> str:
    """`text` after its leading flags and calling-convention words."""
    words = text.split(" ")
    while words and (words[0] in FLAG_WORDS or not words[0]):
        words.pop(0)
    return " ".join(words)


def instruction_class(line: str, checks: set[str]) -> tuple[str, int] | None:
    """(class, count) of one instruction line, or None if it is not counted
    (`checks`: the sanitizer's, see Function.sanitizer_checks)."""
    code = line.strip()
    if code in checks:
        return None
    name = None
    m = re.match(rf"({VALUE})\s*=\s*(.*)$", code)
    if m:
        name, code = m.group(1), m.group(2)
    if name in checks:
        return None
    op, _, rest = code.partition(" ")
    rest = rest.strip()
    if op in ("load", "store"):
        spaces = ADDRESS_SPACE_POINTER.findall(rest)
        return ("memory", 1) if spaces and spaces[-1] in TRACED_ADDRESS_SPACES else None
    if op == "br":
        return ("control", 1) if rest.startswith("i1 ") else None
    if op in ("switch", "indirectbr"):
        return "control", 1
    if op in FLOAT_OPS:
        if op == "fcmp":
            rest = operand_type(rest).partition(" ")[2]
        return "float", lanes(operand_type(rest))[0]
    if op in INTEGER_OPS:
        if op == "icmp":
            rest = operand_type(rest).partition(" ")[2]
        elif op == "getelementptr":
            spaces = ADDRESS_SPACE_POINTER.findall(rest)
            if not spaces or spaces[0] not in TRACED_ADDRESS_SPACES:
                return None  # private memory: registers on a GPU
            return "integer", 1
        return "integer", lanes(operand_type(rest))[0]
    if op in CONVERSION_OPS:
        return "conversion", lanes(operand_type(rest))[0]
    if op == "select":
        count, is_float = lanes(operand_type(split_top_level(rest)[1]))
        return ("float" if is_float else "integer"), count
    if op in OTHER_OPS:
        return "other", 1
    if op in ("call", "tail", "musttail", "notail"):
        if UNCOUNTED_CALLS.search(code):
            return None
        if MEM_INTRINSIC.match(line):
            spaces = ADDRESS_SPACE_POINTER.findall(code)
            return ("memory", 1) if set(spaces) & TRACED_ADDRESS_SPACES else None
        callee = re.search(r"@[\w.$]+", code)
        returned = operand_type(code.partition("call ")[2])
        count, is_float = lanes(returned)
        if callee and callee.group().startswith("@llvm."):
            if INTEGER_INTRINSICS.search(code):
                return "integer", count
            return ("float", count) if is_float else ("other", count)
        return ("float", count) if is_float else ("control", 1)
    return None


@dataclass
class Memory:
    """What a vector in memory is known to hold: values loaded from or stored to it."""

    element_bytes: int
    vectors: set[str]  # whole-vector values
    elements: set[tuple[str, int]]  # (scalar value, byte offset)


class Function:
    """One function body's lines, with the analysis of partial vector stores."""

    def __init__(
        self, lines: list[str], layout: DataLayout, counted: bool = False, number: int = 0
    ) -> None:
        self.lines = lines
        self.layout = layout
        self.counted = counted  # count its instructions (a function of the kernel's sources)
        self.number = number  # names its blocks' count arrays
        self.block_counts: list[tuple[int, ...]] = []
        self.definitions: dict[str, str] = {}
        self.uses: dict[str, int] = {}
        for line in lines:
            m = DEFINITION.match(line)
            if m:
                self.definitions[m.group("name")] = m.group("rest")
            for name in re.findall(VALUE, line):
                self.uses[name] = self.uses.get(name, 0) + 1
        self.counter = 0

    def access(self, index: int) -> Access | None:
        line = self.lines[index]
        kind, m = "load", LOAD.match(line)
        if not m:
            kind, m = "store", STORE.match(line)
        if not m:
            return None
        rest = m.group("rest")
        if rest.startswith(("atomic", "volatile atomic")) and "addrspace(" in rest:
            raise InstrumentError(f"atomic {kind}s are not supported: {line.strip()}")
        parts = split_top_level(re.sub(r"^volatile\s+", "", rest))
        pointer = pointer_operand(parts[1]) if len(parts) > 1 else None
        if pointer is None:
            return None
        if kind == "load":
            return Access(index, "load", parts[0], *pointer, name=m.group("name"))
        t, value = split_type(parts[0])
        return Access(index, "store", t, *pointer, value=value)

    def kept_lanes(self, value: str, memory: Memory, lanes: int) -> set[int] | None:
        """Lanes of `value` equal to what memory holds there, if it derives from `memory`."""
        if value in memory.vectors:
            return set(range(lanes))
        rest = self.definitions.get(value)
        if rest is None:
            return None
        if rest.startswith("insertelement"):
            parts = split_top_level(rest[len("insertelement") :])
            _, source = split_type(parts[0])
            kept = self.kept_lanes(source, memory, lanes)
            lane = re.fullmatch(r"i\d+\s+(\d+)", parts[2]) if len(parts) > 2 else None
            if kept is None:
                return None
            if lane is None:
                return set()
            _, element = split_type(parts[1])
            if (element, int(lane.group(1)) * memory.element_bytes) in memory.elements:
                return kept  # the element was stored there already
            return kept - {int(lane.group(1))}
        if rest.startswith("shufflevector"):
            parts = split_top_level(rest[len("shufflevector") :])
            if len(parts) < 3:
                return None
            (ta, a), (_, b) = split_type(parts[0]), split_type(parts[1])
            width = int(re.match(r"<\s*(\d+)", ta).group(1))
            if width != lanes:
                return None
            mask = self.shuffle_mask(parts[2], lanes)
            kept_a, kept_b = self.kept_lanes(a, memory, lanes), self.kept_lanes(b, memory, lanes)
            out = set()
            for i, source in enumerate(mask):
                if source is None:
                    continue
                if source == i and kept_a is not None and i in kept_a:
                    out.add(i)
                elif source == width + i and kept_b is not None and i in kept_b:
                    out.add(i)
            return out if (kept_a is not None or kept_b is not None) else None
        return None

    @staticmethod
    def shuffle_mask(text: str, lanes: int) -> list[int | None]:
        t, mask = split_type(text)
        if mask == "zeroinitializer":
            return [0] * lanes
        if mask in ("poison", "undef"):
            return [None] * lanes
        out: list[int | None] = []
        for element in split_top_level(mask.strip()[1:-1]):
            v = element.split()[-1]
            out.append(int(v) if re.fullmatch(r"-?\d+", v) else None)
        return out

    def partial_store(self, store: Access) -> tuple[str, list[tuple[int, int]]] | None:
        """(load it replaces, written runs) when `store` rewrites some lanes of a loaded vector.

        Lanes that hold what an earlier store to the same place put there
        (clang re-stores the whole vector after each component) count as kept.
        """
        m = re.fullmatch(r"<\s*(\d+)\s+x\s+(.+?)\s*>", store.type)
        if m is None or not store.value.startswith("%"):
            return None
        lanes, element_bits_ = int(m.group(1)), element_bits(m.group(2))
        if element_bits_ % 8:
            return None
        for name in self.loads.get((store.pointer, store.type), ()):
            if self.uses.get(name, 0) != 2:
                continue
            memory = Memory(element_bits_ // 8, {name}, set())
            base, start = self.offset_from(store.pointer)
            for earlier in self.stores.get(base, ()):
                if earlier.index >= store.index:
                    break
                if earlier.pointer == store.pointer and earlier.type == store.type:
                    memory.vectors.add(earlier.value)
                else:
                    offset = self.offset_from(earlier.pointer)[1] - start
                    memory.elements.add((earlier.value, offset))
            kept = self.kept_lanes(store.value, memory, lanes)
            if kept is None:
                continue
            size = memory.element_bytes
            written = [(i * size, size) for i in range(lanes) if i not in kept]
            return name, runs(tuple(written))
        return None

    def offset_from(self, pointer: str) -> tuple[str, int]:
        """(base, constant byte offset) of `pointer`: a byte GEP of the base, or itself."""
        rest = self.definitions.get(pointer, "")
        m = re.fullmatch(
            rf"getelementptr\s+(?:inbounds\s+)?(?:nuw\s+)?i8,\s*ptr\s+addrspace\(\d+\)\s+"
            rf"({VALUE}),\s*i64\s+(\d+)(?:,\s*!dbg\s+!\d+)?",
            rest.strip(),
        )
        return (m.group(1), int(m.group(2))) if m else (pointer, 0)

    def temporary(self) -> str:
        self.counter += 1
        return f"%msim.{self.counter}"

    def calls(
        self, indent: str, hook: str, space: str, pointer: str, spans, location: str
    ) -> list[str]:
        if not spans:
            return []
        address = self.temporary()
        out = [f"{indent}{address} = ptrtoint ptr addrspace({space}) {pointer} to i64{location}"]
        for offset, size in spans:
            at = address
            if offset:
                at = self.temporary()
                out.append(f"{indent}{at} = add i64 {address}, {offset}{location}")
            out.append(f"{indent}call void @{hook}(i64 {at}, i64 {size}){location}")
        return out

    def instrument(self) -> list[str]:
        accesses = {i: a for i in range(len(self.lines)) if (a := self.access(i))}
        self.loads: dict[tuple[str, str], list[str]] = {}
        self.stores: dict[str, list[Access]] = {}  # by base pointer, in order
        for a in accesses.values():
            if a.kind == "load":
                self.loads.setdefault((a.pointer, a.type), []).append(a.name)
            else:
                self.stores.setdefault(self.offset_from(a.pointer)[0], []).append(a)
        untraced_loads, partial = set(), {}
        for a in accesses.values():
            if a.kind == "store" and a.space in TRACED_ADDRESS_SPACES:
                found = self.partial_store(a)
                if found:
                    untraced_loads.add(found[0])
                    partial[a.index] = found[1]
        counts_at = self.count_blocks() if self.counted else {}
        out = []
        for i, line in enumerate(self.lines):
            if i in counts_at:
                out.append(f"  call void @__msim_count(ptr @msim.counts.{counts_at[i]})")
            location = DEBUG_LOCATION.search(line)
            location = f", !dbg {location.group(1)}" if location else ""
            indent = re.match(r"\s*", line).group()
            a = accesses.get(i)
            if (
                a is not None
                and a.space in TRACED_ADDRESS_SPACES
                and "@" not in a.pointer
                and a.name not in untraced_loads
            ):
                spans = partial.get(i) or runs(self.layout(a.type).leaves)
                hook = "__msim_load" if a.kind == "load" else "__msim_store"
                out += self.calls(indent, hook, a.space, a.pointer, spans, location)
            elif a is None:
                out += self.intrinsic(line, indent, location)
            out.append(line)
        return out

    def sanitizer_checks(self) -> set[str]:
        """The sanitizer's instructions (marked !nosanitize) and the values only its
        branches use (the comparisons they branch on)."""
        checks = {line.strip() for line in self.lines if "!nosanitize" in line}
        for line in checks.copy():
            m = re.match(rf"br i1 ({VALUE}),", line)
            if m and self.uses.get(m.group(1)) == 2:  # its definition and this branch
                checks.add(m.group(1))
        return checks

    def count_blocks(self) -> dict[int, str]:
        """Line index -> counts id where each basic block's count call goes (after
        its label and phis); the counts are added to `block_counts`."""
        checks = self.sanitizer_checks()
        starts = [0] + [i + 1 for i, line in enumerate(self.lines) if LABEL.match(line)]
        ends = starts[1:] + [len(self.lines) + 1]
        placed = {}
        for start, end in zip(starts, ends, strict=True):
            counts = dict.fromkeys(CLASSES, 0)
            for line in self.lines[start : end - 1]:
                found = instruction_class(line, checks)
                if found:
                    counts[found[0]] += found[1]
            if not any(counts.values()):
                continue
            at = start
            while at < len(self.lines) and re.match(rf"\s*{VALUE}\s*=\s*phi\b", self.lines[at]):
                at += 1
            placed[at] = f"{self.number}.{len(self.block_counts)}"
            self.block_counts.append(tuple(counts[c] for c in CLASSES))
        return placed

    def intrinsic(self, line: str, indent: str, location: str) -> list[str]:
        m = MEM_INTRINSIC.match(line)
        if m is None:
            bad = UNTRACEABLE.search(line)
            if bad and any(s in TRACED_ADDRESS_SPACES for s in ADDRESS_SPACE_POINTER.findall(line)):
                raise InstrumentError(f"the simulator cannot trace {bad.group()}: {line.strip()}")
            if re.search(r"\b(?:atomicrmw|cmpxchg)\b", line) and "addrspace(" in line:
                raise InstrumentError(f"atomics are not supported: {line.strip()}")
            return []
        args = split_top_level(m.group("args"))
        size_type, size = args[2].split(None, 1)
        out = []
        if size_type != "i64":
            wide = self.temporary()
            out.append(f"{indent}{wide} = zext {size_type} {size} to i64{location}")
            size = wide
        dst = pointer_operand(args[0])
        src = pointer_operand(args[1]) if m.group("op") != "memset" else None
        dst = dst if dst and dst[0] in TRACED_ADDRESS_SPACES and "@" not in dst[1] else None
        src = src if src and src[0] in TRACED_ADDRESS_SPACES and "@" not in src[1] else None
        if dst and src:
            d, s = self.temporary(), self.temporary()
            out += [
                f"{indent}{d} = ptrtoint ptr addrspace({dst[0]}) {dst[1]} to i64{location}",
                f"{indent}{s} = ptrtoint ptr addrspace({src[0]}) {src[1]} to i64{location}",
                f"{indent}call void @__msim_copy(i64 {d}, i64 {s}, i64 {size}){location}",
            ]
            return out
        for hook, operand in (("__msim_load", src), ("__msim_store", dst)):
            if operand:
                address = self.temporary()
                out += [
                    f"{indent}{address} = ptrtoint ptr addrspace({operand[0]}) {operand[1]} "
                    f"to i64{location}",
                    f"{indent}call void @{hook}(i64 {address}, i64 {size}){location}",
                ]
        return out if (src or dst) else []


def internalize(line: str) -> str:
    """Gives a definition at module level internal linkage (see the module docstring)."""
    if line.startswith("define "):
        if re.match(r"^define\s+available_externally\b", line):
            return line
        line = DEFINE.sub("define internal ", line, count=1)
        return COMDAT_USE.sub("", line)
    m = GLOBAL.match(line)
    if m is None or m.group("name").startswith(("@llvm.", '@"llvm.')):
        return line
    if m.group("linkage") in ("external", "extern_weak", "appending", "private"):
        return line
    rest = line[m.end() :]
    if not re.match(r"(?:[\w()]+\s+)*?(?:global|constant|alias|ifunc)\b", rest):
        return line
    return COMDAT_USE.sub("", f"{m.group('name')} = internal {rest}")


def source_files(module: str) -> dict[str, str]:
    """Debug-info subprogram id -> the file that defines the function."""
    files = {m.group(1): m.group(2) for m in map(DIFILE.match, module.split("\n")) if m}
    return {
        m.group(1): files.get(m.group(2), "")
        for m in map(SUBPROGRAM.match, module.split("\n"))
        if m
    }


def instrument(module: str, uncounted: str | None = None) -> str:
    """The instrumented, internalised module.

    Instructions are counted in the functions with debug information whose
    file is not under `uncounted` (the shim's directory); None counts none.
    """
    layout = DataLayout(module)
    files = source_files(module) if uncounted is not None else {}
    lines = module.split("\n")
    out: list[str] = []
    counts: list[str] = []
    body: list[str] | None = None
    counted, functions = False, 0
    for line in lines:
        if body is not None:
            if line.startswith("}"):
                function = Function(body, layout, counted, functions)
                functions += 1
                out += function.instrument()
                out.append(line)
                counts += [
                    f"@msim.counts.{function.number}.{i} = private unnamed_addr constant "
                    f"[{len(CLASSES)} x i64] [{', '.join(f'i64 {n}' for n in block)}]"
                    for i, block in enumerate(function.block_counts)
                ]
                body = None
            else:
                body.append(line)
            continue
        if COMDAT_DEFINITION.match(line):
            continue
        line = internalize(line)
        out.append(line)
        if line.startswith("define ") and line.rstrip().endswith("{"):
            body = []
            debug = DEFINE_DEBUG.search(line)
            source = files.get(debug.group(1), "") if debug else ""
            counted = bool(source) and not source.startswith(uncounted or "")
    return "\n".join(out) + "\n" + "\n".join(counts) + "\n" + HOOKS
