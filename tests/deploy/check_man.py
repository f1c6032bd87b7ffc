#!/usr/bin/env python3
"""The man pages in docs/man: they render without a warning, and every long option a tool's
--help prints (its subcommands' too) is in its page.

Usage: check_man.py MAN_DIR TOOL=PATH...   (e.g. straitd=build/.../straitd)

- every page renders with `groff -man -Tutf8 -ww -z` (every warning enabled) with no output and
  status 0, and its .TH names the tool, the section of the file name and the version the tool's
  --version prints;
- for each TOOL, the long options of `TOOL --help` and, where it lists subcommands, of
  `TOOL SUB --help` (strait-certs: `strait-certs help`) all appear in TOOL's page;
- the check is real: the page with one option removed fails it.
Exits 77 (skipped) without groff (Debian's groff-base), 1 on a failed check.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def help_text(tool, *args):
    p = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30)
    return p.stdout + p.stderr


def long_options(tool):
    """Every long option of the tool and of its subcommands."""
    if os.path.basename(tool).startswith("strait-certs"):
        texts = [help_text(tool, "help")]
    else:
        top = help_text(tool, "--help")
        texts = [top]
        if "\nSubcommands:\n" in top:
            block = top.split("\nSubcommands:\n", 1)[1]
            for line in block.splitlines():
                m = re.match(r"  (\w[\w-]*)\s", line)
                if m:
                    texts.append(help_text(tool, m.group(1), "--help"))
    opts = set()
    for t in texts:
        opts |= set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", t))
    return opts


def page_text(path):
    """The page's source with roff's escaped hyphens and font changes undone."""
    with open(path) as f:
        src = f.read()
    src = src.replace("\\-", "-")
    return re.sub(r"\\f[BIRP]", "", src)


def missing_options(page, opts):
    text = page_text(page)
    return sorted(o for o in opts if not re.search(re.escape(o) + r"(?![\w-])", text))


def render_warnings(page):
    p = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", page], capture_output=True,
                       text=True)
    return p.returncode, (p.stdout + p.stderr).strip()


def main():
    man_dir = sys.argv[1]
    tools = dict(a.split("=", 1) for a in sys.argv[2:])
    if shutil.which("groff") is None:
        print("SKIP: groff not found (Debian's groff-base)")
        return 77
    pages = sorted(f for f in os.listdir(man_dir) if re.search(r"\.[1-8]$", f))
    for page in pages:
        path = os.path.join(man_dir, page)
        rc, out = render_warnings(path)
        check(rc == 0 and not out, f"{page}: groff -ww warns or fails (rc {rc}):\n{out}")
        name, section = page.rsplit(".", 1)
        th = re.search(r"^\.TH (\S+) (\S+)", open(path).read(), re.M)
        check(th and th.group(1).replace("\\-", "-").lower() == name and th.group(2) == section,
              f"{page}: .TH does not name {name.upper()} {section}")
    for tool, exe in tools.items():
        page = next((p for p in pages if p.rsplit(".", 1)[0] == tool), None)
        if not check(page is not None, f"no man page for {tool} in {man_dir}"):
            continue
        # The page's .TH names the version the tool reports.
        m = re.match(r"\S+ (\d+\.\d+\.\d+)", help_text(exe, "--version"))
        with open(os.path.join(man_dir, page)) as f:
            th = re.search(r'^\.TH .*"Strait ([^"]+)"', f.read(), re.M)
        check(m and th and th.group(1) == m.group(1),
              f"{page}: .TH says Strait {th.group(1) if th else '?'}, {tool} --version says "
              f"{m.group(1) if m else '?'}")
        opts = long_options(exe)
        check(len(opts) >= 2, f"{tool}: found no options in its help ({sorted(opts)})")
        for o in missing_options(os.path.join(man_dir, page), opts):
            check(False, f"{page} lacks {o}, which {tool}'s help prints")
        # Self-test: the page without one of the options must fail.
        victim = sorted(opts - {"--help", "--version"})[0]
        with tempfile.TemporaryDirectory(prefix="strait-man-") as d:
            copy = os.path.join(d, page)
            with open(os.path.join(man_dir, page)) as f:
                src = f.read()
            esc = victim.replace("-", "\\-")
            with open(copy, "w") as f:
                f.write(src.replace(esc, "\\-\\-removed").replace(victim, "--removed"))
            check(victim in missing_options(copy, opts),
                  f"self-test: {page} without {victim} passes the option check")
        print(f"{tool}: {len(opts)} long options, all in {page}")
    for f in failures:
        print("FAIL:", f)
    print(f"check_man: {'%d failed' % len(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
