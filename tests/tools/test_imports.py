"""The import graph of tools/ (read from the source with ast, nothing imported): no cycle, and no study imports the
grid runner (tools/grid/run_grid.py) for something it shares: what the two share lives in the module it belongs to."""

import ast

from conftest import ROOT


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """{module: the tools modules it imports}, at any depth in the module (imports inside functions too)."""
    modules = {module_name(p): p for p in sorted((ROOT / "tools").rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.split(".")[0] == "tools"}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "tools":
                # `from tools.grid import aggregate` imports the module tools.grid.aggregate, not a name of tools.grid
                deps |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
                }
        graph[name] = deps - {name}
    return graph


def find_cycle(graph) -> list[str]:
    """One cycle of the graph as [a, b, ..., a], or [] if it has none (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_graph_reads_the_imports():
    graph = import_graph()
    assert "tools.stats" in graph["tools.grid.aggregate"] and "tools.grid.aggregate_figures" in graph["tools.grid.aggregate"]
    assert graph["tools.stats"] == set()


def test_tools_import_graph_is_acyclic():
    assert find_cycle(import_graph()) == []


def test_no_study_imports_the_grid_runner():
    graph = import_graph()
    assert [m for m, deps in graph.items() if m.startswith("tools.studies") and "tools.grid.run_grid" in deps] == []
