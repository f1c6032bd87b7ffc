# The house line limit (STYLE.md: 100 columns, as .clang-format sets for C++) over the Python
# package, its tests and the Python examples, as CI has no Python linter to enforce it.
import os

from conftest import ROOT

LIMIT = 100


def test_python_lines_fit_100_columns():
    long = []
    for top in ("python", "examples"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "build") and
                       not d.endswith(".egg-info")]
            for name in files:
                if not name.endswith((".py", ".toml")):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        if len(line.rstrip("\n")) > LIMIT:
                            long.append(f"{os.path.relpath(path, ROOT)}:{n}: "
                                        f"{len(line.rstrip())} columns")
    assert not long, "lines over 100 columns:\n" + "\n".join(long)
