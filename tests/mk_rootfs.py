#!/usr/bin/env python3
"""Builds root filesystem tarballs and OCI image archives for the template tests.

  mk_rootfs.py tarball OUT [--gz] [--bin PATH]... [--libs-of PATH]... [--file DST=TEXT]... [--own DST=UID]...
                           [--link DST=TARGET]...
      a merged-/usr root (bin, lib, lib64, sbin -> usr/...) holding the given host binaries at
      usr/bin/NAME, the shared libraries they (and --libs-of binaries) need, and small text files
  mk_rootfs.py layer OUT [--file DST=TEXT]... [--whiteout DST]... [--opaque DIR]...
      one OCI layer (gzip): files, ".wh." whiteouts and opaque markers
  mk_rootfs.py oci OUT LAYER... [--env K=V]... [--workdir D] [--user U]
      an OCI image archive (oci-layout, index.json, blobs/sha256) whose manifest lists the layers in order

Only the standard library: tarfile, json, hashlib.
"""
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile


def add_dir(t, path, mode=0o755, uid=0):
    ti = tarfile.TarInfo(path)
    ti.type = tarfile.DIRTYPE
    ti.mode = mode
    ti.uid = ti.gid = uid
    t.addfile(ti)


def add_file(t, path, data, mode=0o644, uid=0):
    ti = tarfile.TarInfo(path)
    ti.size = len(data)
    ti.mode = mode
    ti.uid = ti.gid = uid
    t.addfile(ti, io.BytesIO(data))


def add_link(t, path, target):
    ti = tarfile.TarInfo(path)
    ti.type = tarfile.SYMTYPE
    ti.linkname = target
    t.addfile(ti)


def libs_of(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(parts[2])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])
    return libs


def usr_path(p):
    """/lib/x/y -> usr/lib/x/y (merged /usr)."""
    p = p.lstrip("/")
    for top in ("lib64", "lib", "bin", "sbin"):
        if p == top or p.startswith(top + "/"):
            return "usr/" + p
    return p


def opts(argv, names):
    got = {n: [] for n in names}
    flags = set()
    rest = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in names:
            got[a].append(argv[i + 1])
            i += 2
        elif a.startswith("--") and a not in names:
            flags.add(a)
            i += 1
        else:
            rest.append(a)
            i += 1
    return got, flags, rest


def tarball(out, argv):
    o, flags, _ = opts(argv, ["--bin", "--libs-of", "--file", "--own", "--link"])
    owners = dict((kv.split("=", 1)[0], int(kv.split("=", 1)[1])) for kv in o["--own"])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs = set()

        def need_dirs(path):
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    add_dir(t, d, uid=owners.get(d, 0))

        add_dir(t, ".")
        for d in ("usr", "usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "tmp"):
            dirs.add(d)
            add_dir(t, d, 0o1777 if d == "tmp" else 0o755)
        for name in ("bin", "sbin", "lib", "lib64"):
            add_link(t, name, "usr/" + name)
        libs = []
        for b in o["--bin"]:
            with open(b, "rb") as f:
                add_file(t, "usr/bin/" + os.path.basename(b), f.read(), 0o755)
            libs += libs_of(b)
        for b in o["--libs-of"]:
            libs += libs_of(b)
        for lib in sorted(set(libs)):
            dst = usr_path(lib)
            need_dirs(dst)
            with open(os.path.realpath(lib), "rb") as f:
                add_file(t, dst, f.read(), 0o755)
        for kv in o["--file"]:
            dst, text = kv.split("=", 1)
            need_dirs(dst)
            add_file(t, dst, text.encode(), uid=owners.get(dst, 0))
        for kv in o["--link"]:
            dst, target = kv.split("=", 1)
            need_dirs(dst)
            add_link(t, dst, target)
    data = buf.getvalue()
    if "--gz" in flags:
        data = gzip.compress(data)
    with open(out, "wb") as f:
        f.write(data)


def layer(out, argv):
    o, _, _ = opts(argv, ["--file", "--whiteout", "--opaque"])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs = set()

        def need_dirs(path):
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    add_dir(t, d)

        for d in o["--opaque"]:
            need_dirs(d + "/.wh..wh..opq")
            add_file(t, d + "/.wh..wh..opq", b"")
        for w in o["--whiteout"]:
            need_dirs(w)
            head, _, base = w.rpartition("/")
            add_file(t, (head + "/" if head else "") + ".wh." + base, b"")
        for kv in o["--file"]:
            dst, text = kv.split("=", 1)
            need_dirs(dst)
            add_file(t, dst, text.encode())
    with open(out, "wb") as f:
        f.write(gzip.compress(buf.getvalue()))


def oci(out, argv):
    o, _, layers = opts(argv, ["--env", "--workdir", "--user"])
    blobs = {}

    def blob(data):
        d = hashlib.sha256(data).hexdigest()
        blobs[d] = data
        return {"digest": "sha256:" + d, "size": len(data)}

    descs = []
    diff_ids = []
    for path in layers:
        with open(path, "rb") as f:
            data = f.read()
        d = blob(data)
        d["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
        descs.append(d)
        diff_ids.append("sha256:" + hashlib.sha256(gzip.decompress(data)).hexdigest())
    cfg = {"architecture": "amd64", "os": "linux",
           "config": {"Env": o["--env"]}, "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    if o["--workdir"]:
        cfg["config"]["WorkingDir"] = o["--workdir"][0]
    if o["--user"]:
        cfg["config"]["User"] = o["--user"][0]
    c = blob(json.dumps(cfg).encode())
    c["mediaType"] = "application/vnd.oci.image.config.v1+json"
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": c, "layers": descs}
    m = blob(json.dumps(manifest).encode())
    m["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    m["platform"] = {"os": "linux", "architecture": "amd64"}
    index = {"schemaVersion": 2, "manifests": [m]}
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as t:
        add_file(t, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add_file(t, "index.json", json.dumps(index).encode())
        add_dir(t, "blobs")
        add_dir(t, "blobs/sha256")
        for d, data in blobs.items():
            add_file(t, "blobs/sha256/" + d, data)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    {"tarball": tarball, "layer": layer, "oci": oci}[sys.argv[1]](sys.argv[2], sys.argv[3:])
