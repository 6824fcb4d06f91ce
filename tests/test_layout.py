"""
test_layout.py — the house stays as built: checks of the source tree's layout, no build needed.

Three rules over the project's C/CUDA files (lib/, kernels/, cmd/, scheduler/, bench/, tests/):
  1. lib/ depends on no kernels/ or scheduler/ header: each `#include "x"` of a file under lib/ is
     resolved the way the compiler does (the including file's directory, then -Ilib, -Ibench,
     -Ischeduler, -Ikernels/cpu, -Ikernels/cuda in that order; the Makefile's CPPFLAGS), and the
     header it finds must not lie under kernels/ or scheduler/. Includes that resolve to no project
     file (system headers) are ignored.
  2. No include circle among the project's files. A node is a "module": a .c/.cu/.cuh/.h file with
     its extension dropped, so a .c (or .cu) and the same-named .h in the same directory are one node
     (lib/run/train.c and lib/run/train.h are lib/run/train). There is an edge A -> B when a file of
     module A includes (resolved as in rule 1) a file of module B != A. A circle is a cycle of this
     graph: every strongly connected component of more than one module is reported once, with the
     #include lines of its edges. tests/ files are nodes too. What the rule cannot see: a header that
     declares the functions of several .c files (data.h, comm.h) makes their calls to each other
     invisible here; a header per .c (bench_cp.h, data_format.h) keeps the check exact.
  3. No production file (lib/, kernels/, cmd/, scheduler/, bench/; not tests/) passes 1,000 lines.

Every failure names the file and the line (the #include line for rules 1 and 2). The checker is
check_tree(root) and is run here on the repository and, in the test_checker_* cases, on synthetic
trees under tmp_path holding each violation, so a checker that reports nothing cannot pass.
"""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE_DIRS = ["lib", "bench", "scheduler", "kernels/cpu", "kernels/cuda"]
SOURCE_DIRS = ["lib", "kernels", "cmd", "scheduler", "bench", "tests"]
PRODUCTION_DIRS = ["lib", "kernels", "cmd", "scheduler", "bench"]
EXTENSIONS = (".c", ".h", ".cu", ".cuh")
MAX_LINES = 1000
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')



def source_files(root):
    """The project's C/CUDA files under SOURCE_DIRS, as paths relative to root ('/' separated)."""
    out = []
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(EXTENSIONS):
                    out.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return out


def resolve(root, including, name):
    """The project file `#include "name"` in `including` finds, or None (a system header)."""
    for d in [os.path.dirname(including)] + INCLUDE_DIRS:
        cand = os.path.normpath(os.path.join(d, name)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def includes(root, path):
    """(line number, included project file) for each #include "..." of path that resolves."""
    out = []
    with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            m = INCLUDE_RE.match(line)
            if m:
                target = resolve(root, path, m.group(1))
                if target:
                    out.append((i, target))
    return out


def module(path):
    return os.path.splitext(path)[0]


def strongly_connected(nodes, edges):
    """Tarjan's algorithm: the strongly connected components of the graph, each a sorted list."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return comps


def check_tree(root):
    """Every layout violation under root, one message each (file:line: what)."""
    files = source_files(root)
    problems = []
    edges, where = {}, {}
    for path in files:
        for line, target in includes(root, path):
            if path.startswith("lib/") and target.startswith(("kernels/", "scheduler/")):
                problems.append(f"{path}:{line}: includes {target} (lib/ must not include kernels/ or scheduler/)")
            a, b = module(path), module(target)
            if a != b:
                edges.setdefault(a, set()).add(b)
                where.setdefault((a, b), f"{path}:{line}")
    for comp in strongly_connected({module(p) for p in files}, edges):
        if len(comp) < 2:
            continue
        links = sorted(f"{where[(a, b)]} ({a} -> {b})" for a in comp for b in comp if (a, b) in where)
        problems.append(f"include circle: {' <-> '.join(comp)}\n    " + "\n    ".join(links))
    for path in files:
        if path.split("/")[0] in PRODUCTION_DIRS:
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                n = sum(1 for _ in f)
            if n > MAX_LINES:
                problems.append(f"{path}:{n}: {n} lines (a production file has at most {MAX_LINES})")
    return problems



def test_layout():
    problems = check_tree(ROOT)
    assert not problems, "layout violations (tests/test_layout.py's docstring has the rules):\n" + "\n".join(problems)


# ---- the checker itself, on synthetic trees ------------------------------------------------------


def write(root, files):
    for path, text in files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_checker_clean_tree(tmp_path):
    write(tmp_path, {
        "lib/core/error.h": "#include <stdio.h>\n",
        "lib/core/error.c": '#include "error.h"\n',
        "lib/run/train.c": '#include "core/error.h"\n#include "train.h"\n',
        "lib/run/train.h": "",
        "kernels/cuda/k.cu": '#include "core/error.h"\n',
    })
    assert check_tree(str(tmp_path)) == []


def test_checker_reports_upward_include(tmp_path):
    write(tmp_path, {
        "lib/run/eval.c": '#include <stdio.h>\n\n#include "backend_select.h"\n',
        "kernels/backend_select.h": "",
        "kernels/cuda/cuda_info.h": "",
        "lib/plan/plan.c": '#include "sbatch.h"\n',
        "scheduler/sbatch.h": "",
        "lib/io/x.c": '#include "cuda_info.h"\n',
    })
    # backend_select.h is not on the include path (kernels/ itself is not -I): it does not resolve
    assert sorted(check_tree(str(tmp_path))) == [
        "lib/io/x.c:1: includes kernels/cuda/cuda_info.h (lib/ must not include kernels/ or scheduler/)",
        "lib/plan/plan.c:1: includes scheduler/sbatch.h (lib/ must not include kernels/ or scheduler/)",
    ]


def test_checker_resolves_own_directory_first(tmp_path):
    write(tmp_path, {
        "lib/data/data.h": "",
        "kernels/cpu/data.h": "",
        "lib/data/data.c": '#include "data.h"\n',  # its own directory: lib/data/data.h, fine
        "lib/io/io.c": '#include "data.h"\n',  # -Ilib has no data.h; -Ikernels/cpu has
    })
    assert check_tree(str(tmp_path)) == [
        "lib/io/io.c:1: includes kernels/cpu/data.h (lib/ must not include kernels/ or scheduler/)"]


def test_checker_reports_circles(tmp_path):
    write(tmp_path, {
        # a two-file circle through a .c and the other's .h
        "bench/bench.h": "", "bench/bench.c": '#include "bench.h"\n\n#include "bench_cp.h"\n',
        "bench/bench_cp.h": "", "bench/bench_cp.c": '#include "bench.h"\n',
        # a three-module circle
        "lib/a/a.h": '#include "b/b.h"\n', "lib/b/b.h": "", "lib/b/b.c": '#include "c/c.h"\n',
        "lib/c/c.h": "", "lib/c/c.c": '#include "a/a.h"\n',
    })
    problems = check_tree(str(tmp_path))
    assert len(problems) == 2
    assert problems[0].startswith("include circle: bench/bench <-> bench/bench_cp\n")
    assert "bench/bench.c:3 (bench/bench -> bench/bench_cp)" in problems[0]
    assert "bench/bench_cp.c:1 (bench/bench_cp -> bench/bench)" in problems[0]
    assert problems[1].startswith("include circle: lib/a/a <-> lib/b/b <-> lib/c/c\n")
    assert "lib/c/c.c:1 (lib/c/c -> lib/a/a)" in problems[1]


def test_checker_reports_long_files(tmp_path):
    write(tmp_path, {
        "kernels/cuda/big.cu": "x\n" * (MAX_LINES + 1),
        "lib/run/ok.c": "x\n" * MAX_LINES,
        "tests/unit/big_test.c": "x\n" * (MAX_LINES + 5),  # tests are not production files
    })
    assert check_tree(str(tmp_path)) == [f"kernels/cuda/big.cu:{MAX_LINES + 1}: {MAX_LINES + 1} lines "
                                         f"(a production file has at most {MAX_LINES})"]

