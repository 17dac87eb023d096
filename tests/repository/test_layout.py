"""The layout rules of the three packages (datafeed, generators, trainer), read
from their source: no import circle, no upward import, no module over 800 lines,
no module that only re-exports another, no private name used across a package
boundary, few entries per folder, and STRUCTURE.md naming every folder and module.

Every import counts: at module level, inside functions (a lazy import still
ties the two modules together) and in ``.pyx``/``.pxd`` files (``import`` and
``cimport``), except those under ``if TYPE_CHECKING:``. Only imports of the
three packages' own modules are considered.

Terms used below: a module's *package* is the package it lies in
(``trainer.ps`` for ``trainer/ps/server.py``, and for ``trainer/ps/__init__.py``);
``from P import name`` imports the module ``P.name`` when there is one, and
otherwise the module ``P`` (its ``__init__``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from support import REPO

PACKAGES = ("datafeed", "generators", "trainer")
MAX_LINES = 800
MAX_TOP_LEVEL_ENTRIES = 10  # in datafeed/ and trainer/, beside __init__.py
MAX_MODULES_PER_PACKAGE = 12
STRUCTURE = REPO / "STRUCTURE.md"
# The parser kernel: one state machine over the bytes, kept in one file so that
# its hot loop compiles as a whole.
LONGER_ALLOWED = {"datafeed/parse/_parse.pyx"}
SOURCE_SUFFIXES = (".py", ".pyx", ".pxd")


@dataclass(frozen=True)
class Import:
    """One imported module (and the names taken from it) at one line of a file."""

    importer: str  # dotted module name
    path: str  # the importer's file, relative to the repository
    line: int
    target: str  # dotted module name, one of the packages' own modules
    names: tuple[str, ...]  # for ``from target import a, b``; () for ``import target``

    def where(self) -> str:
        """``path:line``, for messages."""
        return f"{self.path}:{self.line}"


def source_files() -> list[Path]:
    """Every .py, .pyx and .pxd file of the three packages."""
    return sorted(
        path
        for package in PACKAGES
        for path in (REPO / package).rglob("*")
        if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts
    )


def module_name(path: Path) -> str:
    """``trainer/ps/server.py`` -> ``trainer.ps.server``; an ``__init__`` is its package."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    """Whether the file is a package's ``__init__``."""
    return path.stem == "__init__"


FILES = source_files()
MODULES = {module_name(path): path for path in FILES}  # X.pyx or X.pxd: either, for is_package


def package_of(module: str) -> str:
    """The package a module lies in (a package's ``__init__`` lies in the package)."""
    path = MODULES.get(module)
    if path is not None and is_package(path):
        return module
    return module.rpartition(".")[0]


def is_private(name: str) -> bool:
    """A leading underscore, dunders (``__version__``) excepted."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def own(module: str) -> bool:
    """Whether a dotted name is one of the three packages' modules (or under one)."""
    return module.split(".")[0] in PACKAGES


def resolve(importer: str, path: Path, level: int, module: str | None) -> str:
    """The absolute module of ``from <level dots><module> import ...``."""
    if level == 0:
        return module or ""
    base = importer.split(".") if is_package(path) else importer.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def split_from(target: str, names: tuple[str, ...]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """``from target import names``: each submodule among the names on its own,
    the other names as taken from ``target``."""
    attributes = []
    for name in names:
        if f"{target}.{name}" in MODULES:
            yield f"{target}.{name}", ()
        else:
            attributes.append(name)
    if attributes or not names:
        yield target, tuple(attributes)


def under_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` sits in the body of an ``if TYPE_CHECKING:``."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If) and child in parent.body:
            test = parent.test
            name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
            if name == "TYPE_CHECKING":
                return True
        child, parent = parent, parents.get(parent)
    return False


def python_imports(module: str, path: Path) -> tuple[list[Import], list[tuple[int, str, str]]]:
    """The imports of a .py file, and its ``alias._private`` attribute uses as
    (line, imported module, attribute)."""
    relative = str(path.relative_to(REPO))
    tree = ast.parse(path.read_text(), filename=relative)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    imports: list[Import] = []
    aliases: dict[str, str] = {}  # a name bound to one of the packages' modules
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if under_type_checking(node, parents):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if own(alias.name):
                    imports.append(Import(module, relative, node.lineno, alias.name, ()))
                    if alias.asname:
                        aliases[alias.asname] = alias.name
            continue
        target = resolve(module, path, node.level, node.module)
        if not own(target):
            continue
        names = tuple(alias.name for alias in node.names)
        for resolved, taken in split_from(target, names):
            imports.append(Import(module, relative, node.lineno, resolved, taken))
        for alias in node.names:
            if f"{target}.{alias.name}" in MODULES:
                aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
    uses = [
        (node.lineno, aliases[node.value.id], node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and is_private(node.attr)
    ]
    return imports, uses


CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+(\.*)([\w.]*)\s+)?c?import\s+(.*)$")


def cython_statements(text: str) -> Iterator[tuple[int, str]]:
    """Logical lines of a .pyx/.pxd file (parenthesised continuations joined),
    with their first line number; comments dropped."""
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0]
        if not pending:
            start = number
        pending += " " + line.strip()
        if pending.count("(") > pending.count(")") or pending.rstrip().endswith("\\"):
            pending = pending.rstrip().rstrip("\\")
            continue
        yield start, pending.strip()
        pending = ""


def cython_imports(module: str, path: Path) -> list[Import]:
    """``import``/``cimport`` lines of a .pyx/.pxd file (``cdef extern`` excluded)."""
    relative = str(path.relative_to(REPO))
    imports = []
    for line, statement in cython_statements(path.read_text()):
        match = CYTHON_IMPORT.match(statement)
        if not match or statement.startswith("cdef"):
            continue
        dots, source, rest = match.groups()
        entries = [e.strip() for e in rest.strip("() ").split(",") if e.strip()]
        names = [e.split()[0] for e in entries]
        if source or dots:  # from X (c)import names
            target = resolve(module, path, len(dots), source or None)
            if own(target):
                for resolved, taken in split_from(target, tuple(names)):
                    imports.append(Import(module, relative, line, resolved, taken))
        else:  # (c)import X, Y
            imports += [Import(module, relative, line, n, ()) for n in names if own(n)]
    return imports


def all_imports() -> tuple[list[Import], list[tuple[str, int, str, str, str]]]:
    """Every import of the packages' modules, and every ``alias._private`` use
    as (path, line, importer, imported module, attribute)."""
    imports: list[Import] = []
    uses = []
    for path in FILES:
        module = module_name(path)
        if path.suffix == ".py":
            found, attribute_uses = python_imports(module, path)
            imports += found
            relative = str(path.relative_to(REPO))
            for line, target, attribute in attribute_uses:
                uses.append((relative, line, module, target, attribute))
        else:
            imports += cython_imports(module, path)
    # X.pyx and X.pxd are one module: no edge from a module to itself.
    return [i for i in imports if i.target != i.importer], uses


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_walk_sees_the_packages_and_their_imports():
    """The checks below look at something: every package, its .pyx files, and
    imports of each kind (relative, absolute, cimport)."""
    imports, _ = all_imports()
    assert {"datafeed", "generators", "trainer"} <= set(MODULES)
    assert any(path.suffix == ".pyx" for path in FILES)
    importers = {i.importer for i in imports}
    assert "datafeed" in importers and "trainer" in importers
    assert any(i.path.endswith(".pyx") for i in imports)


def test_no_import_circle():
    imports, _ = all_imports()
    graph: dict[str, set[str]] = {}
    for i in imports:
        graph.setdefault(i.importer, set()).add(i.target)
    problems = []
    for component in strongly_connected(graph):
        members = set(component)
        lines = sorted(
            f"    {i.where()}: {i.importer} imports {i.target}"
            for i in imports
            if i.importer in members and i.target in members
        )
        problems.append(f"circle among {', '.join(component)}:\n" + "\n".join(lines))
    assert not problems, "import circles (module-level and in-function imports):\n" + "\n".join(
        problems
    )


def test_no_upward_import():
    """A module in package ``a.b`` (or below) does not import ``a`` or a module
    that lies in ``a`` (``trainer/ps/x.py``: not ``trainer.fleet``, not
    ``from .. import bind``): a subpackage depends only on itself, on packages
    below it and on other top-level packages."""
    imports, _ = all_imports()
    problems = sorted(
        f"{i.where()}: {i.importer} (package {package_of(i.importer)}) imports {i.target} "
        f"from the enclosing package {package_of(i.target)}"
        for i in imports
        if package_of(i.importer).startswith(package_of(i.target) + ".")
    )
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_no_module_over_800_lines():
    problems = []
    for path in FILES:
        relative = str(path.relative_to(REPO))
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and relative not in LONGER_ALLOWED:
            problems.append(f"{relative}: {lines} lines")
    assert not problems, f"modules over {MAX_LINES} lines:\n" + "\n".join(sorted(problems))


def private_module(module: str) -> bool:
    """Whether a module, or a package it lies in, is private (``datafeed.parse._parse``)."""
    return any(is_private(part) for part in module.split("."))


def private_name_allowed(importer: str, target: str) -> bool:
    """A private name may be taken only from a private module of the importer's
    own package (``datafeed/records/store.py``: ``from ._shuffle import _swap``): a
    private name of a public module (``trainer.fleet._FLEET``) stays in that
    module, and one from another package stays there."""
    return package_of(target) == package_of(importer) and private_module(target)


def test_no_private_name_across_a_package_boundary():
    """A private module (``generators._format``) is imported only from its own
    package, and a private name only from a private module of the importer's
    package; ``alias._name`` on an imported module counts as an import of it."""
    imports, uses = all_imports()
    problems = []
    for i in imports:
        if private_module(i.target) and package_of(i.target) != package_of(i.importer):
            problems.append(
                f"{i.where()}: {i.importer} (package {package_of(i.importer)}) imports the "
                f"private module {i.target} of package {package_of(i.target)}"
            )
        for name in i.names:
            if is_private(name) and not private_name_allowed(i.importer, i.target):
                problems.append(
                    f"{i.where()}: {i.importer} imports the private name {i.target}.{name}"
                )
    for path, line, importer, target, attribute in uses:
        if not private_name_allowed(importer, target):
            problems.append(f"{path}:{line}: {importer} uses the private name {target}.{attribute}")
    assert not problems, "private names across a package boundary:\n" + "\n".join(sorted(problems))


def only_reexports(tree: ast.Module) -> bool:
    """Whether a module's body is nothing but a docstring, imports, ``__all__``
    and ``if TYPE_CHECKING:`` blocks: it defines nothing of its own."""
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        targets = node.targets if isinstance(node, ast.Assign) else []
        if [getattr(t, "id", None) for t in targets] == ["__all__"]:
            continue
        return False
    return True


def test_only_reexports_sees_a_shim():
    """The check below can fail: a re-export module is found, a real one is not."""
    shim = ast.parse('"""Doc."""\nfrom .job.role import Role\n__all__ = ["Role"]\n')
    real = ast.parse('"""Doc."""\nfrom .job.role import Role\nDEFAULT = Role\n')
    assert only_reexports(shim) and not only_reexports(real)


def test_no_module_only_reexports_another():
    """A module that defines nothing (``trainer/role.py`` re-exporting
    ``trainer.job.role``) is a second name for one thing: import the real one.
    A package's ``__init__`` may gather its public names."""
    problems = [
        str(path.relative_to(REPO))
        for path in FILES
        if path.suffix == ".py"
        and not is_package(path)
        and path.name != "__main__.py"
        and only_reexports(ast.parse(path.read_text()))
    ]
    assert not problems, "modules that only re-export others:\n" + "\n".join(problems)


GENERATED = (".so", ".c", ".pyi", ".typed")


def entries(folder: Path) -> list[str]:
    """The source entries of a folder as ``ls`` shows them after a build, less
    build outputs (extensions, generated C, stubs, caches) and ``__init__.py``."""
    return sorted(
        child.name
        for child in folder.iterdir()
        if child.name not in ("__init__.py", "__pycache__")
        and not child.name.endswith(GENERATED)
        and not child.name.startswith(".")
    )


def test_top_level_folders_are_few():
    problems = [
        f"{package}/: {len(found)} entries ({', '.join(found)})"
        for package in ("datafeed", "trainer")
        if len(found := entries(REPO / package)) > MAX_TOP_LEVEL_ENTRIES
    ]
    assert not problems, (
        f"more than {MAX_TOP_LEVEL_ENTRIES} entries beside __init__.py:\n" + "\n".join(problems)
    )


def test_no_package_holds_more_than_12_modules():
    per_package: dict[str, set[str]] = {}
    for path in FILES:
        if not is_package(path):
            per_package.setdefault(package_of(module_name(path)), set()).add(path.stem)
    problems = [
        f"{package}: {len(modules)} modules"
        for package, modules in sorted(per_package.items())
        if len(modules) > MAX_MODULES_PER_PACKAGE
    ]
    assert not problems, (
        f"packages with more than {MAX_MODULES_PER_PACKAGE} modules:\n" + "\n".join(problems)
    )


def test_every_package_says_what_enters_and_leaves():
    """Each package's ``__init__`` opens with a docstring of a few lines."""
    problems = []
    for path in FILES:
        if is_package(path) and path.suffix == ".py":
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if len(doc.splitlines()) < 2:
                problems.append(f"{path.relative_to(REPO)}: {doc!r}")
    assert not problems, "packages without a docstring of a few lines:\n" + "\n".join(problems)


def structure_map() -> dict[str, int]:
    """The paths of STRUCTURE.md's tree (folders end in ``/``), each with its line.

    Each line is an indented name (two spaces a level) and its purpose; a name
    ending in ``/`` opens a folder that the more indented lines below lie in."""
    text = STRUCTURE.read_text()
    block = text.split("## The tree", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    paths: dict[str, int] = {}
    stack: list[str] = []
    first = text[: text.index(block)].count("\n") + 1
    for number, line in enumerate(block.splitlines(), start=first):
        name, _, purpose = line.strip().partition(" ")
        depth = (len(line) - len(line.lstrip(" "))) // 2
        if not purpose.strip():
            raise AssertionError(f"STRUCTURE.md:{number}: {name} has no purpose written beside it")
        if depth > len(stack):
            raise AssertionError(f"STRUCTURE.md:{number}: {name} is indented below no folder")
        del stack[depth:]
        path = "".join(stack) + name
        paths[path] = number
        if name.endswith("/"):
            stack.append(name)
    return paths


def tree_paths() -> set[str]:
    """Every folder (with ``/``) and module file of the three packages, less
    ``__init__.py`` files and stubs."""
    found = set()
    for path in FILES:
        relative = path.relative_to(REPO)
        for parent in list(relative.parents)[:-1]:
            found.add(f"{parent.as_posix()}/")
        if path.name != "__init__.py":
            found.add(relative.as_posix())
    return found


def test_structure_map_is_the_tree():
    listed = structure_map()
    actual = tree_paths()
    missing = sorted(actual - set(listed))
    stale = sorted(f"{path} (STRUCTURE.md:{listed[path]})" for path in set(listed) - actual)
    assert not missing and not stale, (
        "STRUCTURE.md and the tree differ:\n"
        + "".join(f"  not in STRUCTURE.md: {path}\n" for path in missing)
        + "".join(f"  no longer in the tree: {path}\n" for path in stale)
    )
