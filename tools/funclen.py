#!/usr/bin/env python3
"""Prints the longest C functions in dpar.h and backends/*.h (or the files given).

Usage: python3 tools/funclen.py [-n 10] [-max 120] [FILE...]

A function starts at a line beginning (column 0) with a declaration that
ends in `{` and whose previous non-blank text is not inside a function; it
ends at the matching `}` in column 0. Length counts every line from the
signature's first line to the closing brace. With -max N the exit status is
1 when any function is longer than N lines (for CI).
"""
import glob
import re
import sys

SIG = re.compile(r'^(?:static\s+|DPAR_API\s+|inline\s+|DPAR__INLINE\s+)*[A-Za-z_][\w\s\*]*?\b(\w+)\s*\(')


def functions(path):
    """Yields (name, first line, length) for each function in the file."""
    with open(path, encoding='utf-8', errors='replace') as f:
        lines = f.read().split('\n')
    i = 0
    while i < len(lines):
        m = SIG.match(lines[i])
        if not m or lines[i].startswith(('typedef', 'struct', 'union', 'enum', '#')):
            i += 1
            continue
        # the signature runs to the first line ending in `{` (or `;`: a prototype)
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(('{', ';')) and j - i < 12:
            j += 1
        if j >= len(lines) or not lines[j].rstrip().endswith('{'):
            i = j + 1
            continue
        k = j + 1
        while k < len(lines) and not lines[k].startswith('}'):
            k += 1
        yield m.group(1), i + 1, k - i + 1
        i = k + 1


def main(argv):
    n, limit, files = 10, None, []
    it = iter(argv)
    for a in it:
        if a == '-n':
            n = int(next(it))
        elif a == '-max':
            limit = int(next(it))
        else:
            files.append(a)
    if not files:
        files = ['dpar.h'] + sorted(f for f in glob.glob('backends/*.h')
                                    if not f.endswith(('_spirv.h', '_kernels.h')))
    found = [(length, name, path, line) for path in files for name, line, length in functions(path)]
    found.sort(key=lambda t: -t[0])
    for length, name, path, line in found[:n]:
        print(f'{length:5d}  {name}  ({path}:{line})')
    if limit is not None:
        over = [t for t in found if t[0] > limit]
        if over:
            print(f'{len(over)} function(s) over {limit} lines', file=sys.stderr)
            return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
