#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Is the code of some functions unchanged between two builds of one TU?

  python3 benchmarks/codegen_diff.py OLD.s NEW.s REGEX

OLD.s and NEW.s are `g++ -O2 -S` outputs of the same source compiled against
two versions of the headers, e.g. (the fan-out paths without sluice::progress):

  git archive <old-commit> include | tar -x -C /tmp/old
  g++ -std=c++20 -O2 -DNDEBUG -DASIO_NO_DEPRECATED -I/tmp/old/include -Itests -Ibenchmarks \\
      -S -o /tmp/gather_old.s benchmarks/gather_bench.cpp
  g++ -std=c++20 -O2 -DNDEBUG -DASIO_NO_DEPRECATED -Iinclude -Itests -Ibenchmarks \\
      -S -o /tmp/gather_new.s benchmarks/gather_bench.cpp
  python3 benchmarks/codegen_diff.py /tmp/gather_old.s /tmp/gather_new.s 'gather_worker|run_gather'

Takes the functions whose demangled name matches REGEX in each file, drops
directives and replaces symbol names and local labels (a template argument
added to a name changes its mangling, not its code), and compares the bodies
as multisets. Exit status 0 when they are identical.
"""
import re
import subprocess
import sys
from collections import Counter

SKIP = ('.loc', '.cfi', '.file', '.p2align', '.size', '.type', '.section', '.globl', '.weak',
        '.hidden', '.align', '.ident')


def functions(path):
    out, cur, body = {}, None, []
    for line in open(path):
        m = re.match(r'^([A-Za-z_.$][\w.$]*):', line)
        if m and not m.group(1).startswith('.L'):
            if cur:
                out[cur] = body
            cur, body = m.group(1), []
            continue
        s = line.strip()
        if cur is None or not s or s.startswith(SKIP):
            continue
        body.append(re.sub(r'\.L\w+', 'L', re.sub(r'_Z\w+', 'SYM', s)))
    if cur:
        out[cur] = body
    return out


def bodies(path, pattern):
    f = functions(path)
    names = list(f)
    demangled = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True,
                               text=True).stdout.split('\n')
    return Counter(tuple(f[n]) for n, d in zip(names, demangled) if pattern.search(d))


def main():
    old_path, new_path, regex = sys.argv[1:4]
    pattern = re.compile(regex)
    old, new = bodies(old_path, pattern), bodies(new_path, pattern)
    same = sum((old & new).values())
    print(f'functions matching {regex!r}: old {sum(old.values())}, new {sum(new.values())}, '
          f'identical {same}')
    for b in old - new:
        print(f'  only in old: a body of {len(b)} instructions')
    for b in new - old:
        print(f'  only in new: a body of {len(b)} instructions')
    return 0 if old == new else 1


if __name__ == '__main__':
    sys.exit(main())
