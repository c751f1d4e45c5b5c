"""Exit 0 when two kustomize renders hold the same objects.

Used by `scripts/check-k8s --compare`: kustomize v2.0.3 (kubectl 1.20) and v5
differ in document order, in the hash suffix of generated ConfigMaps and in an
empty `annotations: {}` on replaced ConfigMaps; everything else must be equal.
"""

import difflib
import re
import sys

import yaml

HASH = re.compile(r"\b(cms-[a-z]+-config)-[a-z0-9]{10}\b")


def normal(path):
    docs = [d for d in yaml.safe_load_all(open(path, encoding="utf-8")) if d]
    for d in docs:
        if d.get("metadata", {}).get("annotations") == {}:
            del d["metadata"]["annotations"]
    docs.sort(key=lambda d: (d["kind"], d["metadata"]["name"]))
    return HASH.sub(r"\1-HASH", yaml.safe_dump_all(docs, sort_keys=True))


a, b = normal(sys.argv[1]), normal(sys.argv[2])
if a != b:
    sys.stdout.writelines(difflib.unified_diff(a.splitlines(True), b.splitlines(True), sys.argv[1], sys.argv[2]))
    sys.exit(1)
print(f"same objects: {sys.argv[1]} {sys.argv[2]}")
