#!/usr/bin/env python3
"""Check a PGXN META.json against the PGXN Meta Spec 1.0.0.

    python3 scripts/check-meta.py [META.json]

The rules are those of the spec's v1 JSON schemas (required and allowed keys,
SemVer versions, terms and tags, the license shortcuts, prereqs phases and
relationships with version ranges, resources, release_status, meta-spec),
written out here because no validator (pgxn_utils, PGXN::Meta::Validator)
is packaged by Debian.  Then it checks the file against the tree beside it:
each provided extension's file and docfile exist, and the distribution's
version agrees with the control file's default_version (1.1.0 for 1.1).

Prints "META.json is OK" and exits 0, or prints each error and exits 1.
"""

import json
import os
import re
import sys

SEMVER = (r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
          r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
          r"(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
          r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?")
VERSION_RE = re.compile("^" + SEMVER + "$")
# one version, or comparisons AND-ed with commas ("0" is any version)
RANGE_ITEM = r"(?:(?:[=!]=|[<>]=?)\s*)?(?:" + SEMVER + ")"
RANGE_RE = re.compile(r"^(?:" + RANGE_ITEM + r"|0)(?:,\s*" + RANGE_ITEM + r")*$")
TERM_RE = re.compile(r"^[^/\\\s\x00-\x1f\x7f]{2,}$")
TAG_RE = re.compile(r"^[^/\\\x00-\x1f\x7f]{2,255}$")
URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s]+$")
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
CUSTOM_RE = re.compile(r"^[xX]_.")
LICENSES = {
    "agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd",
    "freebsd", "gfdl_1_2", "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1",
    "lgpl_3_0", "mit", "mozilla_1_0", "mozilla_1_1", "openssl", "perl_5",
    "postgresql", "qpl_1_0", "ssleay", "sun", "zlib", "open_source",
    "restricted", "unrestricted", "unknown",
}
TOP_REQUIRED = ["name", "version", "abstract", "maintainer", "license",
                "provides", "meta-spec"]
TOP_OPTIONAL = ["description", "generated_by", "tags", "no_index", "prereqs",
                "release_status", "resources"]
PHASES = ["configure", "build", "test", "runtime", "develop"]
RELATIONSHIPS = ["requires", "recommends", "suggests", "conflicts"]


class Checker:
    def __init__(self):
        self.errors = []

    def error(self, where, msg):
        self.errors.append(f"{where}: {msg}")

    def keys(self, where, obj, allowed, required=(), min_keys=0):
        """obj is an object with only the allowed keys (or x_ ones)."""
        if not isinstance(obj, dict):
            self.error(where, "must be an object")
            return False
        for k in required:
            if k not in obj:
                self.error(where, f"missing required key '{k}'")
        for k in obj:
            if k not in allowed and k not in required and not CUSTOM_RE.match(k):
                self.error(where, f"unknown key '{k}'")
        if len(obj) < min_keys:
            self.error(where, f"needs at least {min_keys} key(s)")
        return True

    def string(self, where, value, pattern=None, what="", min_len=1):
        if not isinstance(value, str) or len(value) < min_len:
            self.error(where, "must be a non-empty string")
        elif pattern is not None and not pattern.match(value):
            self.error(where, f"'{value}' is not a valid {what}")

    def path(self, where, value):
        self.string(where, value)
        if isinstance(value, str) and (value.startswith("/") or "\\" in value):
            self.error(where, f"'{value}' must be a relative unix path")

    def maintainer(self, where, value):
        if isinstance(value, str):
            self.string(where, value)
        elif isinstance(value, list) and value:
            for i, v in enumerate(value):
                self.string(f"{where}[{i}]", v)
        else:
            self.error(where, "must be a string or a non-empty list of strings")

    def license(self, where, value):
        if isinstance(value, str):
            if value not in LICENSES:
                self.error(where, f"'{value}' is not a license shortcut of the spec")
        elif isinstance(value, list) and value:
            for i, v in enumerate(value):
                if v not in LICENSES:
                    self.error(f"{where}[{i}]", f"'{v}' is not a license shortcut")
        elif isinstance(value, dict) and value:
            for k, v in value.items():
                self.string(f"{where}.{k}", v, URI_RE, "URI")
        else:
            self.error(where, "must be a shortcut, a list of them, or an object of URIs")

    def provides(self, where, value):
        if not isinstance(value, dict) or not value:
            self.error(where, "must be an object naming at least one extension")
            return
        for name, ext in value.items():
            w = f"{where}.{name}"
            self.string(w, name, TERM_RE, "term (extension name)")
            if not self.keys(w, ext, allowed=["file", "version", "abstract", "docfile", "docpath"],
                             required=["file", "version"]):
                continue
            if "file" in ext:
                self.path(w + ".file", ext["file"])
            if "version" in ext:
                self.string(w + ".version", ext["version"], VERSION_RE, "SemVer version")
            for k in ("abstract", "docpath"):
                if k in ext:
                    self.string(f"{w}.{k}", ext[k])
            if "docfile" in ext:
                self.path(w + ".docfile", ext["docfile"])

    def prereqs(self, where, value):
        if not self.keys(where, value, allowed=PHASES, min_keys=1):
            return
        for phase, rels in value.items():
            if CUSTOM_RE.match(phase):
                continue
            w = f"{where}.{phase}"
            if not self.keys(w, rels, allowed=RELATIONSHIPS, min_keys=1):
                continue
            for rel, deps in rels.items():
                if CUSTOM_RE.match(rel):
                    continue
                wr = f"{w}.{rel}"
                if not isinstance(deps, dict):
                    self.error(wr, "must be an object of name: version range")
                    continue
                for dep, rng in deps.items():
                    self.string(f"{wr} key", dep, TERM_RE, "term")
                    if rng == 0:
                        continue
                    self.string(f"{wr}.{dep}", rng, RANGE_RE, "version range")

    def resources(self, where, value):
        if not self.keys(where, value, allowed=["homepage", "bugtracker", "repository"],
                         min_keys=1):
            return
        if "homepage" in value:
            self.string(where + ".homepage", value["homepage"], URI_RE, "URI")
        bt = value.get("bugtracker")
        if bt is not None and self.keys(where + ".bugtracker", bt, allowed=["web", "mailto"]):
            if "web" not in bt and "mailto" not in bt:
                self.error(where + ".bugtracker", "needs web or mailto")
            if "web" in bt:
                self.string(where + ".bugtracker.web", bt["web"], URI_RE, "URI")
            if "mailto" in bt:
                self.string(where + ".bugtracker.mailto", bt["mailto"], EMAIL_RE, "email address")
        repo = value.get("repository")
        if repo is not None and self.keys(where + ".repository", repo,
                                          allowed=["url", "web", "type"]):
            if not ("web" in repo or ("url" in repo and "type" in repo)):
                self.error(where + ".repository", "needs web, or url and type")
            for k in ("url", "web"):
                if k in repo:
                    self.string(f"{where}.repository.{k}", repo[k], URI_RE, "URI")
            if "type" in repo:
                self.string(where + ".repository.type", repo["type"],
                            re.compile(r"^[a-z]+$"), "lowercase VCS name")

    def meta(self, meta):
        if not self.keys("META", meta, allowed=TOP_OPTIONAL, required=TOP_REQUIRED):
            return
        if "name" in meta:
            self.string("name", meta["name"], TERM_RE, "term")
        if "version" in meta:
            self.string("version", meta["version"], VERSION_RE, "SemVer version")
        for k in ("abstract", "description", "generated_by"):
            if k in meta:
                self.string(k, meta[k])
        if "maintainer" in meta:
            self.maintainer("maintainer", meta["maintainer"])
        if "license" in meta:
            self.license("license", meta["license"])
        if "provides" in meta:
            self.provides("provides", meta["provides"])
        ms = meta.get("meta-spec")
        if ms is not None and self.keys("meta-spec", ms, allowed=["url"], required=["version"]):
            self.string("meta-spec.version", ms.get("version"),
                        re.compile(r"^1\.0\.\d+$"), "meta-spec version (1.0.x)")
            if "url" in ms and ms["url"] not in ("https://pgxn.org/meta/spec.txt",
                                                 "http://pgxn.org/meta/spec.txt"):
                self.error("meta-spec.url", "must be the spec's own URL")
        if "tags" in meta:
            tags = meta["tags"]
            if not isinstance(tags, list) or not tags:
                self.error("tags", "must be a non-empty list")
            else:
                for i, t in enumerate(tags):
                    self.string(f"tags[{i}]", t, TAG_RE, "tag")
        if "no_index" in meta and self.keys("no_index", meta["no_index"],
                                            allowed=["file", "directory"], min_keys=1):
            for k, v in meta["no_index"].items():
                items = v if isinstance(v, list) else [v]
                for i, p in enumerate(items):
                    self.path(f"no_index.{k}[{i}]", p)
        if "prereqs" in meta:
            self.prereqs("prereqs", meta["prereqs"])
        if "release_status" in meta and meta["release_status"] not in ("stable", "testing",
                                                                       "unstable"):
            self.error("release_status", "must be stable, testing or unstable")
        if "resources" in meta:
            self.resources("resources", meta["resources"])

    def tree(self, meta, root):
        """The files it names exist; the versions agree with the control file."""
        for name, ext in (meta.get("provides") or {}).items():
            if not isinstance(ext, dict):
                continue
            for k in ("file", "docfile"):
                p = ext.get(k)
                if isinstance(p, str) and not os.path.isfile(os.path.join(root, p)):
                    self.error(f"provides.{name}.{k}", f"'{p}' is not a file of the tree")
            if ext.get("version") != meta.get("version"):
                self.error(f"provides.{name}.version",
                           f"{ext.get('version')} is not the distribution's {meta.get('version')}")
            control = os.path.join(root, f"{name}.control")
            if not os.path.isfile(control):
                continue
            with open(control, encoding="utf-8") as f:
                m = re.search(r"^default_version\s*=\s*'([^']*)'", f.read(), re.M)
            version = str(ext.get("version", ""))
            if m and not (version == m.group(1) or version.startswith(m.group(1) + ".")):
                self.error(f"provides.{name}.version",
                           f"{version} does not match {name}.control's default_version "
                           f"'{m.group(1)}'")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "META.json"
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{path} is invalid: {e}")
        return 1
    c = Checker()
    c.meta(meta)
    if isinstance(meta, dict):
        c.tree(meta, os.path.dirname(os.path.abspath(path)))
    if c.errors:
        print(f"{path} is invalid. Errors:")
        for e in c.errors:
            print(f"  {e}")
        return 1
    print(f"{path} is OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
