#!/usr/bin/env python3
"""Checks the module graph of DESIGN.md against the sources: no module includes a header of a
module above it, no module reaches into another module's internal/ folder, and no production
source file grows past the size a reader can hold.

    check_layering.py SOURCE_DIR

Exit 0 when the tree holds to the graph; otherwise every offending line is printed, with the
edge it would add, and the exit code is 1.
"""
import os
import re
import sys

# Which modules each module may include. "common" covers common/ and the public vocabulary in
# include/strata/ (block ids, digests, layouts, statuses); the client's public headers count as
# the client's. Everything not listed is above the module.
ALLOWED = {
    "common": set(),
    "codec": {"common"},
    "storage": {"common"},
    "transport": {"common"},
    "placement": {"common"},
    "proto": {"common"},
    "config": {"common", "storage"},
    "client": {"common", "codec", "transport", "proto", "config"},
    "daemon": {"common", "codec", "storage", "transport", "placement", "proto", "config",
               "client"},
}
CLIENT_PUBLIC = {"strata/client.h", "strata/admin_client.h", "strata/c.h",
                 "strata/device_buffer.h"}
SOURCE_SUFFIXES = (".h", ".cc", ".c", ".cu", ".cuh", ".inc")
# Production sources over this many lines are split by what they hold.
MAX_LINES = 900
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of_header(path):
    """The module a quoted include names, or None for third-party and generated headers."""
    if path in CLIENT_PUBLIC:
        return "client"
    if path.startswith("strata/v1/"):
        return "proto"
    if path.startswith("strata/"):
        return "common"
    top = path.split("/", 1)[0]
    return top if top in ALLOWED else None


def module_of_source(rel):
    parts = rel.split(os.sep)
    if parts[0] == "include":
        return "client" if "/".join(parts[1:]) in CLIENT_PUBLIC else "common"
    return parts[0] if parts[0] in ALLOWED else None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    problems = []
    for top in sorted(set(ALLOWED) | {"include"}):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                module = module_of_source(rel)
                with open(full, encoding="utf-8", errors="replace") as f:
                    lines = f.readlines()
                if len(lines) > MAX_LINES and not name.endswith(".inc"):
                    problems.append(f"{rel}: {len(lines)} lines (the limit is {MAX_LINES})")
                for number, line in enumerate(lines, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    header = m.group(1)
                    target = module_of_header(header)
                    if target is None or target == module:
                        continue
                    if target not in ALLOWED[module]:
                        problems.append(f"{rel}:{number}: {module} -> {target} "
                                        f"(#include \"{header}\"): {target} is not below {module}")
                    elif "/internal/" in header:
                        problems.append(f"{rel}:{number}: reaches into {target}'s internals "
                                        f"(#include \"{header}\")")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layering: {len(problems)} problem(s)")
        return 1
    print("check_layering: the module graph holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
