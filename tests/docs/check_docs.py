#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""The documentation cannot rot: ctest's `docs_check`.

  python3 tests/docs/check_docs.py [SOURCE_DIR]

Over README.md and docs/*.md:
1. Every link and image outside code ([text](target), ![alt](target)) that is
   not a URL points to a file that exists, and its #anchor, if any, to a
   heading of that file (GitHub's ids: lower case, punctuation dropped, spaces
   made hyphens, a repeated heading gets -1, -2, ...).
2. A page that declares `<!-- snippets: FILE ... -->` has every ```cpp block
   in one of those files line for line (blanks at either end of a line, and
   runs of blanks, ignored: the same rule as tests/asyncio_guide_test.cpp for
   docs/asyncio.md), so a snippet cannot drift from code that compiles and
   runs. A page with a ```cpp block and no declaration fails, except those in
   SELF_CHECKED (checked by a test of their own).
"""
import glob
import os
import re
import sys

SELF_CHECKED = {"docs/asyncio.md"}  # tests/asyncio_guide_test.cpp checks it

FENCE = re.compile(r"^\s*```")
LINK = re.compile(r"!?\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SNIPPETS = re.compile(r"<!--\s*snippets:\s*(.*?)\s*-->")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(text):
    seen, out = {}, set()
    in_code = False
    for line in text.split("\n"):
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m and not in_code:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def prose_lines(text):
    """(line number, line with inline code removed) outside fenced blocks."""
    in_code = False
    for i, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            yield i, re.sub(r"`[^`]*`", "``", line)


def normalize(line):
    return " ".join(line.split())


def cpp_blocks(text):
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```cpp":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            yield i + 1, [normalize(l) for l in lines[i + 1:j]]
            i = j
        i += 1


def contains(hay, block):
    n = len(block)
    return any(hay[k:k + n] == block for k in range(len(hay) - n + 1))


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    pages = ["README.md"] + sorted(os.path.relpath(p, root)
                                   for p in glob.glob(os.path.join(root, "docs", "*.md")))
    errors = []
    cache = {}

    def read(path):
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = f.read()
        return cache[path]

    links = blocks = 0
    for page in pages:
        path = os.path.join(root, page)
        text = read(path)
        for n, line in prose_lines(text):
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target):
                    continue  # a URL
                links += 1
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                if not os.path.exists(dest):
                    errors.append(f"{page}:{n}: {target}: no such file")
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors(read(dest)):
                    errors.append(f"{page}:{n}: {target}: no heading with id #{anchor} in "
                                  f"{os.path.relpath(dest, root)}")
        declared = SNIPPETS.search(text)
        sources = []
        if declared:
            for src in declared.group(1).split():
                src_path = os.path.join(root, src)
                if not os.path.exists(src_path):
                    errors.append(f"{page}: snippets: {src}: no such file")
                    continue
                sources.append((src, [normalize(l) for l in read(src_path).split("\n")]))
        for n, block in cpp_blocks(text):
            if page in SELF_CHECKED:
                continue
            blocks += 1
            if not declared:
                errors.append(f"{page}:{n}: a ```cpp block, and the page declares no "
                              "<!-- snippets: FILE ... --> to check it against")
            elif not any(contains(hay, block) for _, hay in sources):
                errors.append(f"{page}:{n}: this ```cpp block is in none of "
                              + ", ".join(s for s, _ in sources) + " line for line")
    for e in errors:
        print(e)
    print(f"check_docs: {len(pages)} pages, {links} links, {blocks} snippets checked, "
          f"{len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
