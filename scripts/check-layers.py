#!/usr/bin/env python3
"""Check that pgqueue's C sources keep their layers (src/README).

    python3 scripts/check-layers.py [--quiet] [SRC_DIR]

Reads src/*.c and src/*.h (SRC_DIR, default the src/ beside this script)
and checks, against LAYERS below (the same table as src/README's):

  - calls: every function a file calls, or refers to (a function pointer),
    that another file defines (not static) must be defined in the caller's
    layer or a layer below it; the same for the variables a file defines
    (not static) and others use;
  - includes: a file includes pgqueue's headers of its layer or below only,
    and a header that is private to some files (PRIVATE) only from them;
  - the table: every file of src/ is in LAYERS, and src/README lists it
    (each .c file under the heading of its layer).

Exits 1 and lists each breach (file:line, caller -> callee (file, layer)),
else prints the include and call graph between the files (with --quiet,
only its last line) and exits 0.  The source is read as text: comments,
strings and character constants are blanked, then a definition is a name
followed by its parameter list and a body at file level, and a call or
use any other occurrence of a name that another file defines.  Macros of
the headers are not followed (none of them calls a function of pgqueue).
"""

import os
import re
import sys

# Bottom to top: (number, name, files).  Mirrors src/README.
LAYERS = [
    (1, "common helpers", ["common.c", "common.h", "pgq_compat.h"]),
    (2, "shared memory and wake-ups",
     ["shmem.c", "publish.c", "bounds.c", "shmem.h", "shmem_internal.h"]),
    (3, "storage", ["tables.c", "ring.c", "retire.c", "uuid7.c", "storage.h"]),
    (4, "job operations", ["jobs.c", "claim.c", "schedule.c", "rate.c", "flow.c", "archive.c", "jobs.h"]),
    (5, "SQL entry points", ["api.c", "admin.c", "api.h"]),
    (6, "processes and hooks", ["worker.c", "launcher.c", "hook.c", "pgqueue.h"]),
    (7, "the module", ["pgqueue.c"]),
]

# Headers that only some files of their layer may include.
PRIVATE = {"shmem_internal.h": {"shmem.c", "publish.c", "bounds.c"}}

LAYER_OF = {f: n for n, _, files in LAYERS for f in files}
LAYER_NAME = {n: name for n, name, _ in LAYERS}

IDENT = re.compile(r"[A-Za-z_]\w*")


def blank(text):
    """The text with comments, strings and character constants blanked
    (newlines kept, so that offsets give the same line numbers)."""
    out = []
    i = 0
    n = len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] != text[i] and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:j]))
        i = j
    return "".join(out)


def without_directives(text):
    """The text with preprocessor lines (and their continuations) blanked."""
    lines = text.split("\n")
    cont = False
    for k, line in enumerate(lines):
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            lines[k] = " " * len(line)
    return "\n".join(lines)


def match_close(text, i, open_ch, close_ch):
    """Offset of the bracket closing the one at offset i."""
    depth = 0
    for k in range(i, len(text)):
        if text[k] == open_ch:
            depth += 1
        elif text[k] == close_ch:
            depth -= 1
            if depth == 0:
                return k
    return len(text)


def definitions(code):
    """Functions and variables defined at file level in code (comments
    and directives blanked): lists of (name, is_static, body_start,
    body_end) for functions and (name, is_static) for variables."""
    funcs = []
    variables = []
    i = 0
    start = 0                   # where the current declaration began
    n = len(code)
    while i < n:
        c = code[i]
        if c == ";":
            decl = code[start:i]
            words = IDENT.findall(decl)
            head = decl.split("=")[0]
            if (words and "extern" not in words and "typedef" not in words
                    and "(" not in head):
                names = IDENT.findall(head.split("[")[0])
                if names and not names[-1].isupper():     # not PG_MODULE_MAGIC
                    variables.append((names[-1], "static" in words))
            start = i + 1
        elif c == "{":
            end = match_close(code, i, "{", "}")
            m = re.search(r"([A-Za-z_]\w*)\s*\(", code[start:i])
            if code[start:i].rstrip().endswith(")") and m:
                words = IDENT.findall(code[start:start + m.start()])
                funcs.append((m.group(1), "static" in words, i, end))
                start = end + 1
            i = end + 1         # an aggregate goes on to its ";"
            continue
        i += 1
    return funcs, variables


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def main(argv):
    quiet = "--quiet" in argv
    args = [a for a in argv if a != "--quiet"]
    src = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    names = sorted(f for f in os.listdir(src) if f.endswith((".c", ".h")))
    problems = []

    for f in names:
        if f not in LAYER_OF:
            problems.append("src/%s: in no layer (add it to LAYERS in %s and to src/README)"
                            % (f, os.path.basename(__file__)))

    # src/README: every file named, each .c file under its layer's heading
    readme_path = os.path.join(src, "README")
    readme = open(readme_path).read() if os.path.exists(readme_path) else ""
    listed = {}
    layer = None
    for line in readme.split("\n"):
        m = re.match(r"(\d+)\. ", line)
        if m:
            layer = int(m.group(1))
        m = re.match(r"   (\S+\.c)\s", line)
        if m and layer is not None:
            listed[m.group(1)] = layer
    for f in names:
        if not re.search(r"\b%s\b" % re.escape(f), readme):
            problems.append("src/README: does not name src/%s" % f)
        elif f.endswith(".c") and f in LAYER_OF and listed.get(f) != LAYER_OF[f]:
            problems.append("src/README: lists src/%s under layer %s, LAYERS says %d"
                            % (f, listed.get(f), LAYER_OF[f]))

    texts = {}
    funcs = {}
    defined = {}                # non-static name -> (file, "function"/"variable")
    statics = {}
    for f in names:
        raw = open(os.path.join(src, f)).read()
        texts[f] = (raw, blank(raw))
        if not f.endswith(".c"):
            continue
        fl, vl = definitions(without_directives(texts[f][1]))
        funcs[f] = fl
        statics[f] = {name for name, st, _, _ in fl if st} | {name for name, st in vl if st}
        for name, st, _, _ in fl:
            if not st:
                defined[name] = (f, "function")
        for name, st in vl:
            if not st:
                defined.setdefault(name, (f, "variable"))

    # includes
    includes = {}
    for f in names:
        raw = texts[f][0]
        for m in re.finditer(r'^#include "([^"]+)"', raw, re.M):
            h = m.group(1)
            if h not in LAYER_OF:
                continue
            includes.setdefault(f, []).append(h)
            where = "src/%s:%d" % (f, line_of(raw, m.start()))
            if f in LAYER_OF and LAYER_OF[h] > LAYER_OF[f]:
                problems.append("%s: includes %s (layer %d, above %s's %d)"
                                % (where, h, LAYER_OF[h], f, LAYER_OF[f]))
            if h in PRIVATE and f not in PRIVATE[h] | {h}:
                problems.append("%s: includes %s, which only %s may include"
                                % (where, h, ", ".join(sorted(PRIVATE[h]))))

    # calls and uses
    edges = {}
    ncalls = 0
    for f in funcs:
        code = texts[f][1]
        for m in IDENT.finditer(code):
            name = m.group()
            if name not in defined or name in statics[f]:
                continue
            owner, kind = defined[name]
            if owner == f:
                continue
            ncalls += 1
            caller = "(file level)"
            for fname, _, b0, b1 in funcs[f]:
                if b0 <= m.start() <= b1:
                    caller = fname
                    break
            if kind == "variable":
                what = name
            elif re.match(r"\s*\(", code[m.end():]):
                what = name + "()"
            else:
                what = "&" + name
            edges.setdefault((f, owner), set()).add(what)
            if f in LAYER_OF and owner in LAYER_OF and LAYER_OF[owner] > LAYER_OF[f]:
                problems.append("src/%s:%d: %s -> %s (%s, layer %d, above %s's %d)"
                                % (f, line_of(code, m.start()), caller, what, owner,
                                   LAYER_OF[owner], f, LAYER_OF[f]))

    if problems:
        print("check-layers: %d breach%s of the layers (src/README):"
              % (len(problems), "" if len(problems) == 1 else "es"))
        for p in problems:
            print("  " + p)
        return 1

    if not quiet:
        print("Layers, bottom to top:")
        for n, name, files in LAYERS:
            print("  %d %-28s %s" % (n, name, " ".join(files)))
        print("\nIncludes (pgqueue's headers):")
        for f in sorted(includes, key=lambda x: (LAYER_OF.get(x, 0), x)):
            print("  %-18s -> %s" % (f, " ".join(includes[f])))
        print("\nCalls and uses between files (caller -> callee: what):")
        for (a, b) in sorted(edges, key=lambda e: (LAYER_OF[e[0]], e[0], LAYER_OF[e[1]], e[1])):
            print("  %-12s %d -> %-12s %d: %s"
                  % (a, LAYER_OF[a], b, LAYER_OF[b], " ".join(sorted(edges[(a, b)]))))
        print()
    print("check-layers: %d files, %d calls and uses between files, none upward: ok"
          % (len(names), ncalls))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
