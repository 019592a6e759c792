#!/usr/bin/env python3
"""Checks the relative links of the project's Markdown pages.

For every [text](path#anchor) and ![image](path) in README.md,
CHANGELOG.md, docs/*.md, bench/*.md and test/soak/*.md (or the files named as arguments): the path must exist,
relative to the page, and the anchor, when there is one, must be the GitHub
slug of a heading of the page it names.  Links with a scheme (http:, mailto:) are not checked.
Prints each broken link and ends with "N links, N broken"; exits 1 when
one is broken.

    python3 scripts/check-links.py [FILE.md ...]
"""
import glob
import os
import re
import sys

LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped
    (letters, digits, '-', '_' and spaces kept), spaces as '-'."""
    s = heading.strip().lower()
    s = re.sub(r'[^\w\- ]', '', s)
    return s.replace(' ', '-')


def anchors(path, cache={}):
    if path not in cache:
        found, seen, fence = set(), {}, False
        with open(path, encoding='utf-8') as f:
            for line in f:
                if line.startswith('```'):
                    fence = not fence
                m = None if fence else re.match(r'^#{1,6} +(.*?) *#*$', line.rstrip('\n'))
                if m:
                    a = slug(m.group(1))
                    n = seen.get(a, 0)
                    seen[a] = n + 1
                    found.add(a if n == 0 else '%s-%d' % (a, n))
        cache[path] = found
    return cache[path]


def links(path):
    fence = False
    with open(path, encoding='utf-8') as f:
        for no, line in enumerate(f, 1):
            if line.startswith('```'):
                fence = not fence
                continue
            if not fence:
                for m in LINK.finditer(line):
                    yield no, m.group(1)


def main(files):
    total = broken = 0
    for page in files:
        for no, target in links(page):
            if re.match(r'^[a-z]+:', target):
                continue
            total += 1
            path, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            why = None
            if not os.path.exists(dest):
                why = 'no such file'
            elif anchor and (os.path.isdir(dest) or not dest.endswith('.md')):
                why = 'an anchor in a file that is not Markdown'
            elif anchor and anchor not in anchors(dest):
                why = 'no heading with that anchor'
            if why:
                broken += 1
                print('%s:%d: %s: %s' % (page, no, target, why))
    print('%d links, %d broken' % (total, broken))
    return 1 if broken else 0


if __name__ == '__main__':
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
    files = sys.argv[1:] or (['README.md', 'CHANGELOG.md'] + sorted(glob.glob('docs/*.md')) +
                             sorted(glob.glob('bench/*.md')) + sorted(glob.glob('test/soak/*.md')))
    sys.exit(main(files))
