"""Prompt datasets built from the docstrings of installed Python code.

Real text that nobody wrote for this project, present on any machine with Python: the
docstrings of the standard library and of named installed packages. Files are parsed
with `ast` (nothing is imported, so no package runs any code), walked in sorted order,
and each documented function or class becomes one prompt. Modules are split between
training and held-out prompts by a hash of the module name, so no held-out prompt
shares a module, let alone a text, with a training prompt.

    draftsmith promptgen docstrings --train data/docs-train.jsonl \\
        --heldout data/docs-heldout.jsonl --min-train 10000 --package numpy --package scipy
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import sys
import sysconfig
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.fsutil import atomic

# What a prompt asks of the documented object; picked per object by a hash of its name.
TEMPLATES = (
    "Explain in plain words what the Python {kind} `{name}` from `{module}` does, "
    "based on its documentation:\n\n{doc}",
    "Write a short example that uses `{module}.{name}`. Its documentation says:\n\n{doc}",
    "Summarise this documentation of `{name}` in two or three sentences:\n\n{doc}",
    "What would a programmer use the {kind} `{name}` for? Here is its docstring:\n\n{doc}",
)
# Standard-library parts that are tests, GUIs or vendored copies, not library text.
SKIPPED_DIRS = {"test", "tests", "testing", "idlelib", "tkinter", "turtledemo", "lib2to3", "site-packages"}
# Where a docstring's prose ends and its reference sections (or doctests) begin.
SECTION_STARTS = ("parameters", "returns", "examples", "example", "args:", "arguments:", "raises", "see also")
MIN_DOC_CHARS = 60
MAX_DOC_CHARS = 1200
# Held-out modules: a hash of the module name falls in the first `share` of these buckets.
HASH_BUCKETS = 10_000
HELDOUT_SHARE = 0.03


class PromptSourceError(DraftsmithError):
    pass


@dataclass(frozen=True)
class Documented:
    module: str
    name: str
    kind: str  # "function" or "class"
    doc: str

    @property
    def id(self) -> str:
        return f"{self.module}.{self.name}"

    def prompts(self, count: int = 1) -> list[tuple[str, str]]:
        """(id, prompt) for `count` different templates, the first picked by a hash of the
        name, the others following it: count 1 gives the same first prompt as any count."""
        first = module_hash(self.id)
        rows = []
        for i in range(count):
            template = TEMPLATES[(first + i) % len(TEMPLATES)]
            text = template.format(kind=self.kind, name=self.name, module=self.module, doc=self.doc)
            rows.append((self.id if i == 0 else f"{self.id}~{i + 1}", text))
        return rows


def module_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def held_out(key: str, share: float = HELDOUT_SHARE) -> bool:
    """Whether `key` (a module name, or any other split key) falls in the held-out share."""
    return module_hash(key) % HASH_BUCKETS < share * HASH_BUCKETS


def normalised(text: str) -> str:
    """The form under which two texts count as the same (case, spacing, unicode forms)."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def source_roots(packages: list[str], stdlib: bool = True) -> list[tuple[str, Path]]:
    """(module prefix, directory) of the standard library and each named package."""
    roots: list[tuple[str, Path]] = []
    if stdlib:
        roots.append(("", Path(sysconfig.get_paths()["stdlib"])))
    for name in packages:
        spec = importlib.util.find_spec(name)  # a top-level lookup executes nothing
        if spec is None or not spec.submodule_search_locations:
            raise PromptSourceError(f"--package {name}: not an installed package")
        roots.append((name, Path(next(iter(spec.submodule_search_locations)))))
    return roots


def module_files(prefix: str, root: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if any(p in SKIPPED_DIRS or p.startswith(("_", ".")) and p != "__init__" for p in parts):
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(p for p in (prefix, *parts) if p)
        if module:
            yield module, path


def clean_doc(doc: str) -> str | None:
    """The docstring's prose (before its parameter sections and doctests), whole
    paragraphs up to MAX_DOC_CHARS; None when too little prose is left."""
    kept: list[str] = []
    for line in doc.strip().splitlines():
        head = line.strip().casefold()
        if ">>>" in line or head.startswith(SECTION_STARTS) or head.startswith((".. ", "--")):
            break
        kept.append(line.rstrip())
    paragraphs = [p.strip() for p in "\n".join(kept).split("\n\n") if p.strip()]
    text = ""
    for paragraph in paragraphs:
        if len(text) + len(paragraph) > MAX_DOC_CHARS:
            break
        text = f"{text}\n\n{paragraph}" if text else paragraph
    if len(text) < MIN_DOC_CHARS or sum(c.isalpha() for c in text) < 0.6 * len(text.replace(" ", "")):
        return None
    return text


def documented_objects(module: str, path: Path) -> Iterator[Documented]:
    """Public, documented top-level functions and classes (and class methods) of one file."""
    for obj, name, doc in documented_nodes(path):
        kind = "class" if isinstance(obj, ast.ClassDef) else "function"
        yield Documented(module, name, kind, doc)


def documented_nodes(path: Path) -> Iterator[tuple[ast.AST, str, str]]:
    """(definition node, dotted name, cleaned docstring) of documented_objects, in its order."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return  # a file for another Python version: not this machine's library text
    for node in tree.body:
        for obj, name in public_definitions(node, ""):
            doc = clean_doc(ast.get_docstring(obj) or "")
            if doc is not None:
                yield obj, name, doc


def public_definitions(node: ast.AST, owner: str) -> Iterator[tuple[ast.AST, str]]:
    """A public function or class and, for a top-level class, its public members."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return
    if node.name.startswith("_"):
        return
    name = f"{owner}{node.name}"
    yield node, name
    if isinstance(node, ast.ClassDef) and not owner:
        for child in node.body:
            yield from public_definitions(child, f"{name}.")


def collect(
    roots: list[tuple[str, Path]], heldout_share: float, templates: int = 1
) -> tuple[list[dict], list[dict]]:
    """Training and held-out prompt rows; a text seen before (normalised) is skipped.
    Each training object gives `templates` prompts, each held-out object one."""
    seen: set[str] = set()
    train: list[dict] = []
    heldout: list[dict] = []
    for prefix, root in roots:
        for module, path in module_files(prefix, root):
            held = held_out(module, heldout_share)
            for obj in documented_objects(module, path):
                key = normalised(obj.doc)
                if key in seen:
                    continue
                seen.add(key)
                rows = heldout if held else train
                rows.extend({"id": i, "prompt": p} for i, p in obj.prompts(1 if held else templates))
    return train, heldout


def build(
    train_path: Path,
    heldout_path: Path,
    *,
    packages: list[str],
    min_train: int,
    heldout_count: int,
    heldout_share: float = HELDOUT_SHARE,
    stdlib: bool = True,
    templates: int = 1,
) -> dict:
    """Write both JSONL files (rows: id, prompt); refuses fewer prompts than asked for."""
    if not 1 <= templates <= len(TEMPLATES):
        raise PromptSourceError(f"--templates {templates}: between 1 and {len(TEMPLATES)}")
    roots = source_roots(packages, stdlib)
    train, heldout = collect(roots, heldout_share, templates)
    if len(train) < min_train or len(heldout) < heldout_count:
        raise PromptSourceError(
            f"only {len(train)} training and {len(heldout)} held-out prompts in "
            f"{[str(r) for _, r in roots]}; asked for {min_train} and {heldout_count} "
            "(name more packages with --package)"
        )
    # Spread the held-out prompts over modules rather than taking the first ones.
    heldout = sorted(heldout, key=lambda row: module_hash(row["id"]))[:heldout_count]
    atomic.write_jsonl(train_path, train)
    atomic.write_jsonl(heldout_path, heldout)
    return {
        "train": len(train),
        "heldout": len(heldout),
        "python": sys.version.split()[0],
        "roots": [str(r) for _, r in roots],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftsmith promptgen docstrings", description=__doc__)
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--heldout", type=Path, required=True)
    parser.add_argument("--package", action="append", default=[], help="an installed package to read too")
    parser.add_argument("--min-train", type=int, default=10_000)
    parser.add_argument("--heldout-count", type=int, default=64)
    parser.add_argument("--no-stdlib", action="store_true")
    parser.add_argument(
        "--templates",
        type=int,
        default=1,
        help=f"training prompts per documented object, each with another template (1-{len(TEMPLATES)})",
    )
    args = parser.parse_args(argv)
    for path in (args.train, args.heldout):
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        info = build(
            args.train,
            args.heldout,
            packages=args.package,
            min_train=args.min_train,
            heldout_count=args.heldout_count,
            stdlib=not args.no_stdlib,
            templates=args.templates,
        )
    except PromptSourceError as exc:
        print(f"draftsmith: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {info['train']} training and {info['heldout']} held-out prompts from {info['roots']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
