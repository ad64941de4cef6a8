"""No two of the project's modules import each other, directly, through others, or from inside a function.

A cycle hidden in a function (a "lazy" import) still ties the two modules together: neither can be
read, tested or moved without the other. Imports under `if TYPE_CHECKING:` count too, for the same reason.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "server", "master", "shard", "cli")


def module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of the packages by dotted name (a package by its own name, from its __init__.py)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                # `from package import module` imports the module; `from module import name` the module.
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    found = set()
    for target in targets:
        # `import a.b.c` runs a and a.b first: the nearest project module named is what it depends on.
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(f"{target}."):
            found.add(target)
    return found


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    modules = module_names(root, packages)
    return {name: imported(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path) through each group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_path_through(group, graph) for group in groups]


def _path_through(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest way from the group's first module back to itself, staying inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in {group}")


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_is_scanned(package):
    graph = import_graph(ROOT, PACKAGES)
    assert any(name == package or name.startswith(f"{package}.") for name in graph)
    assert any(graph[name] for name in graph if name.startswith(f"{package}."))


def test_no_module_imports_itself_back():
    found = cycles(import_graph(ROOT, PACKAGES))
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_a_lazy_import_back_is_a_cycle(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import f\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import os\nif True:\n    from pkg import a\n")
    (package / "d.py").write_text("from .a import f\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


# Who may import whom (docs/architecture.md). A module is ruled by the longest key below that is its name
# or a package above it; it may import the project modules under that key and under the key's values,
# nothing else.
SHARD_STATE = ["shard.models", "shard.services", "shard.outbox", "shard.locks"]
ALLOWED_IMPORTS: dict[str, list[str]] = {
    # The shared model and libraries: nothing of either role, the project or the command line.
    "common": [],
    # The command line talks to the REST API only: of ours, only pure rules and words, never Django.
    "cli": [
        "common.ab",
        "common.blobs",
        "common.constants",
        "common.errors",
        "common.network",
        "common.syntax",
        "common.units",
    ],
    # The Django project (settings, URLconfs, wsgi, manage, serve): the one place that sees both roles.
    "server": ["common", "master", "shard"],
    "master": ["common"],
    # Tokens, authentication and the audit trail's writer: below every other part of the master.
    "master.access": ["common", "master.models"],
    "shard": ["common"],
    # The shard's state: its database and every change to it, below everything else of the shard.
    **{module: ["common", *SHARD_STATE] for module in SHARD_STATE},
    # Talking to the master.
    "shard.sync": ["common", *SHARD_STATE],
    # Running jobs: a run's process, host and directory, its inputs and outputs; it asks the heartbeat lock
    # who is alive.
    "shard.run": ["common", *SHARD_STATE, "shard.blobs", "shard.config", "shard.sync.leader"],
    # A job's inputs (the shard's cache of the master's blobs) and its outputs: fetched and sent through the
    # sync, opened the way runs open files, reached by the job's user.
    "shard.blobs": ["common", *SHARD_STATE, "shard.sync", "shard.run.executor", "shard.run.isolation"],
    # What a run left goes up: logs and result files.
    "shard.uploads": ["common", *SHARD_STATE, "shard.config", "shard.sync", "shard.run", "shard.blobs"],
    "shard.elastic": ["common", *SHARD_STATE, "shard.run"],
}
# Only these may import the key: the master's outer layers (the REST API, the admin, the heartbeat endpoint,
# the metrics and overview pages) only the URLconf (the admin shows the overview's counts too); what a shard
# process runs only its commands.
IMPORTED_ONLY_BY: dict[str, list[str]] = {
    "master.api": ["server.urls"],
    "master.admin": ["server.urls"],
    "master.sync.endpoint": ["server.urls"],
    "master.observe": ["server.urls", "master.admin"],
    "shard.process": ["shard.management"],
    "shard.uploads": ["shard.process"],
    "shard.elastic": ["shard.management"],
}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(f"{prefix}.")


def rule_of(name: str, table: dict[str, list[str]]) -> str | None:
    keys = [key for key in table if under(name, key)]
    return max(keys, key=len) if keys else None


def broken_rules(graph: dict[str, set[str]], allowed: dict[str, list[str]], only_by: dict[str, list[str]]) -> list[str]:
    broken = []
    for name, targets in sorted(graph.items()):
        key = rule_of(name, allowed)
        for target in sorted(targets):
            if key is not None and not any(under(target, ok) for ok in [key, *allowed[key]]):
                broken.append(f"{name} imports {target} ({key} may import only {', '.join(allowed[key]) or 'itself'})")
            inner = rule_of(target, only_by)
            if inner and not under(name, inner) and not any(under(name, ok) for ok in only_by[inner]):
                broken.append(f"{name} imports {target} (only {', '.join(only_by[inner])} may)")
    return broken


def test_every_module_imports_only_what_its_layer_may():
    broken = broken_rules(import_graph(ROOT, PACKAGES), ALLOWED_IMPORTS, IMPORTED_ONLY_BY)
    assert not broken, "imports against docs/architecture.md:\n" + "\n".join(broken)


def test_every_rule_names_modules_that_exist():
    """A rule left behind by a move (a name that matches nothing) would hold nothing true."""
    graph = import_graph(ROOT, PACKAGES)
    names = [
        *ALLOWED_IMPORTS,
        *IMPORTED_ONLY_BY,
        *(v for vs in [*ALLOWED_IMPORTS.values(), *IMPORTED_ONLY_BY.values()] for v in vs),
    ]
    missing = sorted({n for n in names if not any(under(m, n) for m in graph) and n.split(".")[0] in PACKAGES})
    assert not missing, f"rules name modules that do not exist: {missing}"


def test_a_rule_catches_an_import_it_forbids():
    graph = {
        "shard.sync.client": {"shard.run.scheduler"},
        "cli.main": {"common.models"},
        "master.services.x": {"master.api.y"},
    }
    broken = broken_rules(graph, ALLOWED_IMPORTS, IMPORTED_ONLY_BY)
    assert [line.split(" (")[0] for line in broken] == [
        "cli.main imports common.models",
        "master.services.x imports master.api.y",
        "shard.sync.client imports shard.run.scheduler",
    ]
