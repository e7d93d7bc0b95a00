"""Print pip's configured package sources and constraints as ``uv pip install`` flags, one per line.

uv does not read pip's configuration (pip.conf, ``PIP_*``); ``scripts/setup.sh`` hands it pip's own
index URLs, find-links and constraint files so that both installers see the same packages. Reads
``pip config list`` from stdin (lines such as ``global.extra-index-url='url1 url2'``).
"""

import shlex
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}

seen = set()
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    flag = FLAGS.get(key.rpartition(".")[2])
    if flag is None:
        continue
    for v in " ".join(shlex.split(value)).split():
        if (flag, v) not in seen:
            seen.add((flag, v))
            print(flag, v, sep="\n")
