"""The house rules, checked: no import cycle, stages apart, the offline prompt generators
apart, console scripts that import, and every artifact file name spelled only in the
store's layout, and no module over 500 lines (docs/architecture.md)."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest

from draftsmith.runtime.sglang import REFUSED
from draftsmith.store import layout
from draftsmith.store.keys import STAGES

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "draftsmith"
STAGE_PACKAGES = {*STAGES, "report"}
INFRASTRUCTURE = {
    "store",
    "runtime",
    "target",
    "formats",
    "fsutil",
    "draft",
    "config",
    "errors",
    "speculation",
}
# The offline prompt-file generators: they use infrastructure, and nothing imports them but
# the `draftsmith promptgen` command, inside its handler.
PROMPTGEN = "promptgen"
PROMPTGEN_LAZY_IMPORTERS = {"draftsmith.cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def import_statements(tree: ast.AST, in_functions: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of `tree`; without `in_functions`, only those importing the
    module runs (none inside a function, method or lambda)."""
    functions = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        todo += [
            child for child in ast.iter_child_nodes(node) if in_functions or not isinstance(child, functions)
        ]
    return found


def imports(name: str, in_functions: bool = True) -> set[str]:
    """Every draftsmith module `name` imports, anywhere in it (function-local imports too,
    unless `in_functions` is false)."""
    found = set()
    for node in import_statements(ast.parse(MODULES[name].read_text()), in_functions):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("draftsmith")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("draftsmith"):
            for alias in node.names:  # `from draftsmith.pkg import mod` imports the module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return found & set(MODULES)


def top(name: str) -> str:
    return name.split(".")[1] if name.count(".") else ""


def cycles() -> list[list[str]]:
    graph = {name: imports(name) for name in MODULES}
    found, done = [], set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            found.append(path[path.index(name) :] + [name])
            return
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    return found


def test_no_import_cycle():
    assert cycles() == []


def test_the_guard_sees_a_cycle(monkeypatch, tmp_path):
    """The cycle check itself works: two modules importing each other are found."""
    (tmp_path / "a.py").write_text("from draftsmith.b import x\n")
    (tmp_path / "b.py").write_text("import draftsmith.a\n")
    monkeypatch.setitem(MODULES, "draftsmith.a", tmp_path / "a.py")
    monkeypatch.setitem(MODULES, "draftsmith.b", tmp_path / "b.py")
    assert ["draftsmith.a", "draftsmith.b", "draftsmith.a"] in cycles()


def imports_where(importer: set[str], forbidden) -> list[str]:
    """`name imports dep` for each module of the `importer` packages whose import `forbidden` refuses."""
    return [
        f"{name} imports {dep}"
        for name in MODULES
        if top(name) in importer
        for dep in imports(name)
        if forbidden(name, dep)
    ]


def test_stages_use_each_other_only_through_their_package():
    """A stage may use what another stage's package exports, never its modules."""

    def internal(name: str, dep: str) -> bool:
        other = top(dep)
        return other in STAGE_PACKAGES and other != top(name) and dep != f"draftsmith.{other}"

    assert imports_where(STAGE_PACKAGES, internal) == []


def test_infrastructure_imports_no_stage():
    assert imports_where(INFRASTRUCTURE, lambda _name, dep: top(dep) in STAGE_PACKAGES) == []


def test_formats_imports_no_store():
    """The file formats sit below the artifact store (its plan, verify, gc and migrate read
    them): what both need lives below both, in fsutil."""

    assert imports_where({"formats"}, lambda _name, dep: top(dep) == "store") == []


def test_promptgen_uses_only_infrastructure():
    """The prompt generators may import infrastructure and each other, no stage nor anything else."""
    allowed = INFRASTRUCTURE | {PROMPTGEN}
    found = imports_where({PROMPTGEN}, lambda _name, dep: top(dep) not in allowed)
    assert found == [], f"draftsmith.promptgen may import only {sorted(allowed)}: {found}"


def promptgen_importers() -> list[str]:
    """`name imports dep` for each module outside promptgen that imports it; a lazy
    importer may, inside its functions."""
    return [
        f"{name} imports {dep}"
        for name in MODULES
        if top(name) != PROMPTGEN
        for dep in imports(name, in_functions=name not in PROMPTGEN_LAZY_IMPORTERS)
        if top(dep) == PROMPTGEN
    ]


def test_nothing_imports_promptgen():
    """Nothing in the pipeline imports the prompt generators; `draftsmith promptgen` loads
    them only when it runs, so no other command imports them."""
    found = promptgen_importers()
    assert found == [], (
        f"only {sorted(PROMPTGEN_LAZY_IMPORTERS)} may import draftsmith.promptgen, lazily: {found}"
    )
    lazily = imports("draftsmith.cli") - imports("draftsmith.cli", in_functions=False)
    assert any(top(dep) == PROMPTGEN for dep in lazily), "the cli's handler imports the generators"


@pytest.mark.parametrize(
    ("importer", "text"),
    [
        ("draftsmith.cli", "from draftsmith.promptgen import styles\n"),
        ("draftsmith.report", "def f():\n    import draftsmith.promptgen.styles\n"),
    ],
)
def test_the_guard_sees_a_promptgen_import(monkeypatch, tmp_path, importer, text):
    """An import of promptgen on import of the cli, or anywhere in another module, is found."""
    (tmp_path / "m.py").write_text(text)
    monkeypatch.setitem(MODULES, importer, tmp_path / "m.py")
    assert promptgen_importers() == [f"{importer} imports draftsmith.promptgen.styles"]


def test_console_scripts_import():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("scripts", {})
    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attr)), name


# HF's directory layout (the target, and the serving formats built on it) fixes these, not
# us; `hf` (the converted model's directory) is also the name of a generation backend.
HF_NAMES = {layout.EXPORT_FILES["config"], layout.EXPORT_FILES["weights"], layout.FILES["model"]["hf"]}
ARTIFACT_NAMES = (
    {Path(name).name for files in layout.FILES.values() for name in files.values()}
    | set(layout.RESULTS.values())
    | {layout.MANIFEST, layout.JOURNAL, layout.ANSWERS_FILE, layout.HASH_CACHE, layout.STAGED}
) - HF_NAMES


def python_strings(path: Path) -> list[str]:
    """String constants of a module, docstrings left out (they may name files)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def snakemake_code(path: Path) -> list[str]:
    return [line.split("#", 1)[0] for line in path.read_text().splitlines()]


def spelled(texts: list[str]) -> set[str]:
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, ARTIFACT_NAMES)) + r")(?![\w-])")
    return {match for text in texts for match in pattern.findall(text)}


def test_artifact_file_names_are_spelled_only_in_the_layout():
    where = {}
    for path in [*SRC.rglob("*.py"), *(REPO / "scripts").glob("*.py")]:
        if path != SRC / "store" / "layout.py":
            where[path] = spelled(python_strings(path))
    for path in [REPO / "Snakefile", *(REPO / "rules").glob("*.smk")]:
        where[path] = spelled(snakemake_code(path))
    assert {str(p.relative_to(REPO)): names for p, names in where.items() if names} == {}


@pytest.mark.parametrize("text", ['x = "train.jsonl"', 'f"{root}/manifest.json"'])
def test_the_guard_sees_a_file_name(tmp_path, text):
    module = tmp_path / "m.py"
    module.write_text(text + "\n")
    assert spelled(python_strings(module))


def test_refused_sglang_flags_are_listed_once():
    """Generation, capture and serving refuse extra args from one list (`runtime.sglang.REFUSED`):
    no other module spells a refused flag."""
    home = SRC / "runtime" / "sglang.py"
    spelled_elsewhere = {
        str(path.relative_to(REPO)): found
        for path in SRC.rglob("*.py")
        if path != home and (found := set(python_strings(path)) & set(REFUSED))
    }
    assert spelled_elsewhere == {}


# A module holds one concern; past this many lines it is split along its seams
# (docs/architecture.md says so, and names any module allowed to stay whole).
MAX_MODULE_LINES = 500


def test_no_module_is_over_the_line_limit():
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def stage_entry_points() -> dict[str, ast.FunctionDef]:
    """The entry function each job script hands `from_snakemake`, by script name."""
    found = {}
    for script in sorted((REPO / "scripts").glob("*.py")):
        tree = ast.parse(script.read_text())
        sources = {
            alias.asname or alias.name: node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names
        }
        called = [
            node.args[1].id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "from_snakemake"
            and isinstance(node.args[1], ast.Name)
        ]
        assert len(called) == 1, f"{script.name}: expected one from_snakemake(snakemake, <entry>) call"
        module = ast.parse(MODULES[sources[called[0]]].read_text())
        (function,) = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == called[0]]
        found[script.stem] = function
    return found


def test_stage_entry_points_take_settings_never_the_raw_config():
    """A job gets its stage's settings and artifact (resolved once by workflow.configure),
    not the whole config to re-read and re-check."""
    entries = stage_entry_points()
    assert len(entries) == len(list((REPO / "scripts").glob("*.py")))
    taking_config = sorted(name for name, f in entries.items() if "config" in {a.arg for a in f.args.args})
    assert taking_config == []
    lacking = sorted(name for name, f in entries.items() if f.args.args[0].arg != "settings")
    assert lacking == [], "an entry function's first parameter is its stage's settings"
