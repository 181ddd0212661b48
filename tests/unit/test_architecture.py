"""docs/architecture.md stays true: every import of product code (lazy ones and
TYPE_CHECKING ones too) is an arrow of its `arrows` table, no product modules
import each other in a circle, no product module passes ~600 lines, every module
its noun table names exists, every arrow is one an import takes, every ground module is
named, and every Go command is named on the page. thaw's
Go files (go/cmd, go/internal; tests aside) keep the same cap."""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
PACKAGES = ("control", "runsc_hooks", "nvproxy")
GROUND = "ground"
# A module this long is two nouns (docs/style.md: 100-400 lines is the usual size).
MAX_LINES = 600


def product_modules() -> dict[str, Path]:
    """Every product module by dotted name (generated gRPC code aside)."""
    out = {}
    for pkg in PACKAGES:
        for f in (REPO / pkg).rglob("*.py"):
            rel = f.relative_to(REPO)
            if "rpc" in rel.parts or "__pycache__" in rel.parts:
                continue
            name = ".".join(rel.with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def room(module: str) -> str:
    """control.thawd.pods -> control/thawd; control.errors -> the ground; nvproxy.cdi -> nvproxy."""
    parts = module.split(".")
    if parts[0] != "control":
        return parts[0]
    if len(parts) == 1 or (REPO / "control" / f"{parts[1]}.py").is_file():
        return GROUND
    return f"control/{parts[1]}"


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of thaw's packages in `path`, wherever it sits."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out += [(node.lineno, n) for n in names if n.split(".")[0] in PACKAGES]
    return out


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The product module `name` (a module, or a name inside one) refers to."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def arrows() -> dict[str, set[str]]:
    block = re.search(r"```arrows\n(.*?)```", DOC.read_text(), re.S)
    assert block, "docs/architecture.md has no ```arrows table"
    table: dict[str, set[str]] = {}
    for line in block.group(1).splitlines():
        if line.strip():
            src, _, dst = line.partition("->")
            table[src.strip()] = set(dst.split())
    return table


def room_imports() -> list[tuple[str, str, str]]:
    """(source room, destination room, where) of every import of one room by another."""
    modules = product_modules()
    out = []
    for name, path in sorted(modules.items()):
        src = room(name)
        for line, target in imports(path):
            dst_mod = resolve(target, modules)
            if dst_mod is None:
                continue   # a package's own __init__ re-export, or a name that does not exist (caught at import)
            dst = room(dst_mod)
            if dst != src and dst != GROUND:
                out.append((src, dst, f"{path.relative_to(REPO)}:{line} imports {target}"))
    return out


def test_every_import_is_an_arrow_of_the_table():
    table, modules = arrows(), product_modules()
    rooms = {room(m) for m in modules} - {GROUND}
    assert set(table) == rooms, f"rooms without a line, or lines without a room: {set(table) ^ rooms}"
    bad = [f"{where} ({src} -> {dst})" for src, dst, where in room_imports()
           if src == GROUND or dst not in table[src]]
    assert not bad, "imports that docs/architecture.md does not allow:\n" + "\n".join(bad)


def test_every_arrow_of_the_table_is_an_import():
    """An arrow no import takes says a room depends on one it does not: the map is wrong."""
    used = {(src, dst) for src, dst, _ in room_imports()}
    unused = sorted(f"{src} -> {dst}" for src, dsts in arrows().items() for dst in dsts if (src, dst) not in used)
    assert not unused, "arrows of docs/architecture.md that no import uses: " + ", ".join(unused)


def test_the_page_names_every_module_of_the_ground():
    """The ground (modules directly under control/) is listed on the page, each named in its prose."""
    text = DOC.read_text()
    ground = {p.stem for p in (REPO / "control").glob("*.py") if p.stem != "__init__"}
    listed = re.search(r"`control/\{([a-z_,]+)\}\.py`", text)
    assert listed, "docs/architecture.md lists no ground as control/{...}.py"
    assert set(listed.group(1).split(",")) == ground, f"the ground is {sorted(ground)}"
    unnamed = sorted(m for m in ground if f"`{m}.py`" not in text)
    assert not unnamed, f"ground modules the prose does not name: {unnamed}"


def test_the_table_has_no_circle():
    table = arrows()
    seen: dict[str, int] = {}

    def visit(r: str, path: list[str]) -> None:
        if seen.get(r) == 1:
            pytest.fail("a circle of rooms: " + " -> ".join(path + [r]))
        if seen.get(r) == 2:
            return
        seen[r] = 1
        for nxt in table.get(r, ()):
            visit(nxt, path + [r])
        seen[r] = 2
    for r in table:
        visit(r, [])


def test_no_product_modules_import_each_other_in_a_circle():
    modules = product_modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for _, target in imports(path):
            dst = resolve(target, modules)
            if dst and dst != name and dst not in PACKAGES:
                graph[name].add(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def strong(v: str) -> None:   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))
    for v in sorted(modules):
        if v not in index:
            strong(v)
    assert not circles, f"modules that import each other in a circle: {circles}"


def test_no_product_module_is_two_nouns_long():
    long = {str(p.relative_to(REPO)): n for p in product_modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_go_file_is_two_nouns_long():
    """The same cap for thaw's Go (its tests aside): a file per noun, as runsc's cmd/*.go."""
    files = [p for d in ("cmd", "internal") for p in (REPO / "go" / d).rglob("*.go")
             if not p.name.endswith("_test.go")]
    assert len(files) > 20
    long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"Go files over {MAX_LINES} lines: {long}"


def test_every_module_the_noun_table_names_exists():
    text = DOC.read_text()
    table = text[text.index("## One noun, one module"):text.index("## Go")]
    named = re.findall(r"`((?:control|runsc_hooks|nvproxy|go)/[^`\s]*)`", table)
    assert len(named) > 40
    missing = [n for n in named if not (REPO / n).exists()]
    assert not missing, f"the noun table names what does not exist: {missing}"


def test_every_go_command_is_named():
    text = DOC.read_text()
    commands = sorted(p.name for p in (REPO / "go" / "cmd").iterdir() if p.is_dir())
    missing = [c for c in commands if f"`go/cmd/{c}`" not in text]
    assert not missing, f"Go commands docs/architecture.md does not name: {missing}"
