"""Build upstream's control-plane binaries from source through the Go module proxy, cached.

Usage::

    python -m tests.cluster.build                 # build (or reuse) the newest release
    python -m tests.cluster.build --release 1.34  # the oldest release with resource.k8s.io/v1
    python -m tests.cluster.build --where         # print the directory, build nothing
    python -m tests.cluster.build --scheduler-perf  # also upstream's scheduler_perf DRA binary

``make control-plane`` runs the first form and prints where the binaries are. The release can
also be chosen with ``BIAXIAL_K8S_RELEASE`` (``1.37`` when unset).

What is built, each at the version its :class:`Release` pins:

- ``kube-apiserver``, ``kube-controller-manager``, ``kube-scheduler`` from the module
  ``k8s.io/kubernetes``. That module's ``go.mod`` requires its staging modules
  (``k8s.io/api``, ``k8s.io/client-go`` ...) at ``v0.0.0`` and points them at ``./staging``,
  which only works inside upstream's repository; so the build runs in a small *wrapper module*
  that requires ``k8s.io/kubernetes`` and replaces every staging module by its published
  ``v0.X.Y`` (the workaround described in kubernetes/kubernetes#79384). The list of staging
  modules is read from the release's own ``go.mod`` every time, never kept by hand.
- ``etcd`` from ``go.etcd.io/etcd/server/v3``, in a wrapper of its own, so that etcd's client
  modules never change what the Kubernetes binaries link (minimum version selection would
  otherwise mix the two graphs).
- ``kwok`` from ``sigs.k8s.io/kwok``: fake nodes and the pod lifecycle without a kubelet.
- on request (``--scheduler-perf``), ``dra.test``: ``go test -c`` of upstream's scheduler_perf
  DRA benchmark from the same ``k8s.io/kubernetes``, in a wrapper of its own (its test-only
  dependencies fetched with ``go get -t``), cached under ``<version>/scheduler-perf/`` with its
  own stamp (:func:`build_scheduler_perf`).

Every binary is stamped with its version (``/version`` and ``--version`` are truthful), built
with ``-trimpath`` and without symbols, by the local Go toolchain (``GOTOOLCHAIN=local``).

The cache: ``<cache>/control-plane/<kubernetes version>/`` (``<cache>`` is
``$BIAXIAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/biaxial``, else ``~/.cache/biaxial``), with a
``stamp.json`` naming the versions, the Go toolchain and each binary's SHA-256. A build whose
stamp matches is skipped, so a second ``make control-plane`` returns at once.

Bring your own binaries the way controller-runtime's envtest does: ``TEST_ASSET_<NAME>`` (for
example ``TEST_ASSET_KUBE_APISERVER=/usr/local/bin/kube-apiserver``) names one binary,
``KUBEBUILDER_ASSETS=<dir>`` a directory holding them; both win over the build
(:func:`binaries`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

KUBE_COMMANDS: Final = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
CONTROL_PLANE: Final = (*KUBE_COMMANDS, "etcd", "kwok")
# module proxy downloads plus Go's build cache plus the binaries, with room to spare
NEEDED_FREE_BYTES: Final = 8 << 30


@dataclass(frozen=True, slots=True)
class Release:
    """One Kubernetes release and the versions of everything built beside it."""

    kubernetes: str  # v1.X.Y
    etcd: str  # v3.6.Z
    kwok: str

    @property
    def minor(self) -> str:
        return ".".join(self.kubernetes.removeprefix("v").split(".")[:2])

    @property
    def staging(self) -> str:
        """The version of the staging modules published with this release: v0.X.Y."""
        return "v0." + self.kubernetes.removeprefix("v1.")


RELEASES: Final = {
    "1.37": Release(kubernetes="v1.37.2", etcd="v3.6.16", kwok="v0.8.0"),
    "1.34": Release(kubernetes="v1.34.4", etcd="v3.6.16", kwok="v0.8.0"),
}
DEFAULT_RELEASE: Final = "1.37"


class BuildError(Exception):
    """The build cannot go on; the message says why and what to do."""


def release(name: str | None = None) -> Release:
    """The release named (``1.37``), by ``BIAXIAL_K8S_RELEASE``, or the default."""
    key = name or os.environ.get("BIAXIAL_K8S_RELEASE") or DEFAULT_RELEASE
    if key not in RELEASES:
        raise BuildError(f"unknown release {key!r}; known: {', '.join(sorted(RELEASES))}")
    return RELEASES[key]


def cache_root() -> Path:
    explicit = os.environ.get("BIAXIAL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "biaxial"


def release_dir(rel: Release) -> Path:
    return cache_root() / "control-plane" / rel.kubernetes


def binaries(rel: Release, names: tuple[str, ...] = CONTROL_PLANE) -> dict[str, Path]:
    """Where each binary is: ``TEST_ASSET_<NAME>``, else ``$KUBEBUILDER_ASSETS/<name>``, else
    the build cache. Only paths to existing files are returned; a name without one is left
    out, so the caller can say which are missing."""
    found: dict[str, Path] = {}
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    for name in names:
        explicit = os.environ.get("TEST_ASSET_" + name.upper().replace("-", "_"))
        for candidate in (
            Path(explicit) if explicit else None,
            Path(assets) / name if assets else None,
            release_dir(rel) / "bin" / name,
        ):
            if candidate is not None and candidate.is_file():
                found[name] = candidate
                break
    return found


# --------------------------------------------------------------------------- the Go side


def _go_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=mod -buildvcs=false")
    env.pop("GOWORK", None)
    env["PWD"] = str(workdir)
    return env


def _go(args: list[str], workdir: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        ["go", *args],
        cwd=workdir,
        env=env or _go_env(workdir),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        raise BuildError(f"`go {' '.join(args)}` failed in {workdir}:\n{tail}")
    return proc.stdout


def go_version() -> str:
    if shutil.which("go") is None:
        raise BuildError("no `go` on PATH: the control plane is built with the local Go toolchain")
    out = subprocess.run(
        ["go", "env", "GOVERSION"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GOTOOLCHAIN": "local"},
    )
    return out.stdout.strip()


def module_gomod(path: str, version: str, workdir: Path) -> str:
    """The ``go.mod`` of ``path@version`` as the module proxy serves it."""
    env = _go_env(workdir)
    env["GOFLAGS"] = "-buildvcs=false"
    info = json.loads(_go(["mod", "download", "-json", f"{path}@{version}"], workdir, env))
    if info.get("Error"):
        raise BuildError(f"the module proxy did not serve {path}@{version}: {info['Error']}")
    return Path(info["GoMod"]).read_text()


def local_replacements(gomod: str) -> list[str]:
    """The modules a ``go.mod`` points at its own directories (``m => ./dir`` or ``../dir``):
    the ones a wrapper must replace by published versions. Guards that point a module at a
    directory that does not exist (etcd's ``=> ./FORBIDDEN_DEPENDENCY``) are left out."""
    pairs = re.findall(r"^\s*(?:replace\s+)?(\S+)\s*=>\s*(\.\.?/\S*)", gomod, re.MULTILINE)
    return sorted({module for module, target in pairs if "FORBIDDEN" not in target})


def wrapper_gomod(name: str, main: str, version: str, gomod: str, replaced_version: str) -> str:
    """A wrapper module requiring ``main@version``, its local replacements pointed at
    ``replaced_version``, with the wrapped module's ``go`` and ``godebug`` lines (only the main
    module's count)."""
    go_line = re.search(r"^go \S+$", gomod, re.MULTILINE)
    lines = [f"module biaxial.test/{name}", "", go_line.group(0) if go_line else "go 1.24", ""]
    lines += re.findall(r"^godebug .+$", gomod, re.MULTILINE)
    lines += ["", f"require {main} {version}", ""]
    replaced = [m for m in local_replacements(gomod) if m != main]
    if replaced:
        lines.append("replace (")
        lines += [f"\t{m} => {m} {replaced_version}" for m in replaced]
        lines.append(")")
    return "\n".join(lines) + "\n"


def _kube_ldflags(rel: Release) -> str:
    major, minor = rel.kubernetes.removeprefix("v").split(".")[:2]
    stamp = {
        "gitVersion": rel.kubernetes,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",  # reproducible: the build is a function of inputs
    }
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.{key}={value}" for key, value in stamp.items()]
    return " ".join(flags)


@dataclass(frozen=True, slots=True)
class Step:
    """One wrapper module and the commands built in it."""

    name: str
    module: str
    version: str
    commands: tuple[tuple[str, str], ...]  # (binary name, package path)
    replaced_version: str
    ldflags: str
    cgo: bool = False  # runc's nsenter is C
    tags: str = ""


def steps(rel: Release) -> list[Step]:
    return [
        Step(
            "kubernetes",
            "k8s.io/kubernetes",
            rel.kubernetes,
            tuple((c, f"k8s.io/kubernetes/cmd/{c}") for c in KUBE_COMMANDS),
            rel.staging,
            _kube_ldflags(rel),
        ),
        Step(
            "etcd",
            "go.etcd.io/etcd/server/v3",
            rel.etcd,
            (("etcd", "go.etcd.io/etcd/server/v3"),),
            rel.etcd,
            "-s -w",
        ),
        Step(
            "kwok",
            "sigs.k8s.io/kwok",
            rel.kwok,
            (("kwok", "sigs.k8s.io/kwok/cmd/kwok"),),
            rel.kwok,
            f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={rel.kwok}",
        ),
    ]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _expected_stamp(rel: Release, go: str) -> dict[str, object]:
    return {"release": asdict(rel), "go": go, "recipe": 1}


def cached(rel: Release) -> bool:
    """Whether the cache holds this release's binaries, as the stamp says they were built."""
    return _stamp_matches(release_dir(rel), _expected_stamp(rel, go_version()), CONTROL_PLANE)


def _stamp_matches(top: Path, expected: dict[str, object], names: tuple[str, ...]) -> bool:
    stamp_path = top / "stamp.json"
    if not stamp_path.is_file():
        return False
    stamp = json.loads(stamp_path.read_text())
    if {k: stamp.get(k) for k in expected} != expected:
        return False
    bins = top / "bin"
    recorded: dict[str, dict[str, object]] = stamp.get("binaries", {})
    return all(
        (bins / name).is_file()
        and (bins / name).stat().st_size == recorded.get(name, {}).get("size")
        for name in names
    )


def check_disk(path: Path, needed: int = NEEDED_FREE_BYTES) -> None:
    probe = path
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise BuildError(
            f"only {free / 2**30:.1f} GiB free under {probe}; building the control plane needs "
            f"about {needed / 2**30:.0f} GiB (Go's module and build caches plus the binaries)"
        )


def build(rel: Release, *, log: bool = True) -> Path:
    """Build every binary of ``rel`` into the cache (or reuse it); returns the bin directory."""
    if cached(rel):
        return release_dir(rel) / "bin"
    what = f"the control plane {rel.kubernetes}"
    return _build_into(release_dir(rel), steps(rel), _expected_stamp(rel, go_version()),
                       CONTROL_PLANE, what, log=log)  # fmt: skip


def _build_into(
    top: Path,
    todo: list[Step],
    expected: dict[str, object],
    names: tuple[str, ...],
    what: str,
    *,
    log: bool,
) -> Path:
    """Build ``todo`` into ``top/bin`` and write the stamp (``expected`` plus each binary's
    size and SHA-256 and the seconds per step)."""
    bins = top / "bin"
    check_disk(top)
    if log:
        print(f"building {what} with {expected['go']} into {bins}", flush=True)
    bins.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    for step in todo:
        started = time.monotonic()
        work = top / "src" / step.name
        work.mkdir(parents=True, exist_ok=True)
        _build_step(step, work, bins)
        timings[step.name] = round(time.monotonic() - started, 1)
        if log:
            print(f"  {step.name} {step.version}: {timings[step.name]:.0f} s", flush=True)
    stamp = expected | {
        "binaries": {
            name: {"size": (bins / name).stat().st_size, "sha256": _sha256(bins / name)}
            for name in names
        },
        "build_seconds": timings,
    }
    (top / "stamp.json").write_text(json.dumps(stamp, indent=2) + "\n")
    return bins


def _build_step(step: Step, work: Path, bins: Path) -> None:
    gomod = module_gomod(step.module, step.version, work)
    (work / "go.mod").write_text(
        wrapper_gomod(step.name, step.module, step.version, gomod, step.replaced_version)
    )
    env = _go_env(work)
    if step.cgo:
        env["CGO_ENABLED"] = "1"
    tags = ["-tags", step.tags] if step.tags else []
    for binary, package in step.commands:
        tmp = bins / f".{binary}.tmp"
        _go(
            ["build", "-trimpath", *tags, "-ldflags", step.ldflags, "-o", str(tmp), package],
            work,
            env,
        )
        tmp.replace(bins / binary)


# --------------------------------------------------------------------------- scheduler_perf

#: upstream's scheduler_perf DRA benchmark, a test binary of ``k8s.io/kubernetes``
SCHEDULER_PERF: Final = ("dra.test",)
SCHEDULER_PERF_PACKAGE: Final = "k8s.io/kubernetes/test/integration/scheduler_perf/dra"


def scheduler_perf_dir(rel: Release) -> Path:
    """``<release dir>/scheduler-perf``: ``bin/dra.test``, ``dra/`` (the package's
    ``performance-config.yaml`` and ``templates/``, which the binary reads from its working
    directory), ``src/`` (the wrapper module) and a stamp of its own."""
    return release_dir(rel) / "scheduler-perf"


def _scheduler_perf_stamp(rel: Release) -> dict[str, object]:
    return {"release": asdict(rel), "go": go_version(), "recipe": 1}


def scheduler_perf_cached(rel: Release) -> bool:
    return _stamp_matches(scheduler_perf_dir(rel), _scheduler_perf_stamp(rel), SCHEDULER_PERF)


def build_scheduler_perf(rel: Release, *, log: bool = True) -> Path:
    """``go test -c`` of scheduler_perf's DRA package from the same pinned ``k8s.io/kubernetes``
    (its test-only dependencies fetched with ``go get -t`` in a wrapper of its own, so the
    control plane's wrapper never changes), and its config beside it; returns the directory
    to run it in (``<scheduler_perf_dir>/dra``; the binary is ``../bin/dra.test``)."""
    top = scheduler_perf_dir(rel)
    if scheduler_perf_cached(rel):
        return top / "dra"
    check_disk(top)
    expected = _scheduler_perf_stamp(rel)
    work = top / "src"
    bins = top / "bin"
    work.mkdir(parents=True, exist_ok=True)
    bins.mkdir(parents=True, exist_ok=True)
    if log:
        print(f"building scheduler_perf (dra) {rel.kubernetes} with {expected['go']}", flush=True)
    started = time.monotonic()
    gomod = module_gomod("k8s.io/kubernetes", rel.kubernetes, work)
    (work / "go.mod").write_text(
        wrapper_gomod("scheduler-perf", "k8s.io/kubernetes", rel.kubernetes, gomod, rel.staging)
    )
    _go(["get", "-t", SCHEDULER_PERF_PACKAGE], work)
    tmp = bins / ".dra.test.tmp"
    _go(
        ["test", "-c", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp), SCHEDULER_PERF_PACKAGE],
        work,
    )
    tmp.replace(bins / "dra.test")
    source = Path(_go(["list", "-f", "{{.Dir}}", SCHEDULER_PERF_PACKAGE], work).strip())
    config = top / "dra"
    shutil.rmtree(config, ignore_errors=True)
    config.mkdir()
    shutil.copy(source / "performance-config.yaml", config)
    shutil.copytree(source / "templates", config / "templates")
    for path in [config, *config.rglob("*")]:  # the module cache's files are read-only
        path.chmod(0o755 if path.is_dir() else 0o644)
    seconds = round(time.monotonic() - started, 1)
    stamp = expected | {
        "binaries": {
            "dra.test": {
                "size": (bins / "dra.test").stat().st_size,
                "sha256": _sha256(bins / "dra.test"),
            }
        },
        "build_seconds": {"scheduler-perf": seconds},
    }
    (top / "stamp.json").write_text(json.dumps(stamp, indent=2) + "\n")
    if log:
        print(f"  scheduler_perf (dra): {seconds:.0f} s", flush=True)
    return config


# --------------------------------------------------------------------------- the node


@dataclass(frozen=True, slots=True)
class NodeRelease:
    """The node components built beside one Kubernetes release: the kubelet from the same
    ``k8s.io/kubernetes`` wrapper as the control plane, containerd 2.x (CRI with CDI), runc,
    and the CNI plugins a one-node pod network needs."""

    kubernetes: str
    containerd: str
    runc: str
    cni: str


NODE_RELEASES: Final = {
    "1.37": NodeRelease("v1.37.2", containerd="v2.2.9", runc="v1.4.4", cni="v1.9.1"),
    "1.34": NodeRelease("v1.34.4", containerd="v2.2.9", runc="v1.4.4", cni="v1.9.1"),
}
CNI_PLUGINS: Final = ("bridge", "host-local", "loopback", "portmap")
NODE: Final = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc", *CNI_PLUGINS)
_CNI_PACKAGES: Final = {
    "bridge": "main",
    "host-local": "ipam",
    "loopback": "main",
    "portmap": "meta",
}


def node_release(rel: Release) -> NodeRelease:
    return NODE_RELEASES[rel.minor]


def node_dir(rel: Release) -> Path:
    return cache_root() / "node" / rel.kubernetes


def node_steps(rel: Release) -> list[Step]:
    nrel = node_release(rel)
    containerd = "github.com/containerd/containerd/v2"
    cni = "github.com/containernetworking/plugins"
    return [
        Step(
            "kubernetes",
            "k8s.io/kubernetes",
            rel.kubernetes,
            (("kubelet", "k8s.io/kubernetes/cmd/kubelet"),),
            rel.staging,
            _kube_ldflags(rel),
        ),
        Step(
            "containerd",
            containerd,
            nrel.containerd,
            tuple(
                (c, f"{containerd}/cmd/{c}")
                for c in ("containerd", "containerd-shim-runc-v2", "ctr")
            ),
            nrel.containerd,
            f"-s -w -X {containerd}/version.Version={nrel.containerd}",
            tags="no_btrfs no_devmapper no_zfs",
        ),
        Step(
            "runc",
            "github.com/opencontainers/runc",
            nrel.runc,
            (("runc", "github.com/opencontainers/runc"),),
            nrel.runc,
            f"-s -w -X main.version={nrel.runc.removeprefix('v')}",
            cgo=True,  # libcontainer/nsenter is C; seccomp links libseccomp (libseccomp-dev)
            tags="seccomp urfave_cli_no_docs",
        ),
        Step(
            "cni",
            cni,
            nrel.cni,
            tuple((c, f"{cni}/plugins/{_CNI_PACKAGES[c]}/{c}") for c in CNI_PLUGINS),
            nrel.cni,
            f"-s -w -X {cni}/pkg/utils/buildversion.BuildVersion={nrel.cni}",
        ),
    ]


def _node_stamp(rel: Release) -> dict[str, object]:
    return {"release": asdict(node_release(rel)), "go": go_version(), "recipe": 1}


def node_cached(rel: Release) -> bool:
    return _stamp_matches(node_dir(rel), _node_stamp(rel), NODE)


def build_node(rel: Release, *, log: bool = True) -> Path:
    """Build the node's binaries of ``rel`` into the cache (or reuse it); the bin directory."""
    if node_cached(rel):
        return node_dir(rel) / "bin"
    what = f"the node {rel.kubernetes}"
    return _build_into(node_dir(rel), node_steps(rel), _node_stamp(rel), NODE, what, log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", help=f"one of {', '.join(sorted(RELEASES))}")
    parser.add_argument("--where", action="store_true", help="print the directory only")
    parser.add_argument(
        "--node", action="store_true", help="also the node: kubelet, containerd, runc, CNI"
    )
    parser.add_argument(
        "--scheduler-perf",
        action="store_true",
        help="also upstream's scheduler_perf DRA benchmark (go test -c; about 10 min on 2 cores)",
    )
    args = parser.parse_args(argv)
    try:
        rel = release(args.release)
        if args.where:
            print(release_dir(rel) / "bin")
            return 0
        started = time.monotonic()
        bins = build(rel)
        print(f"control plane {rel.kubernetes} ({time.monotonic() - started:.1f} s): {bins}")
        for name, path in sorted(binaries(rel).items()):
            print(f"  {name}: {path}")
        if args.node:
            started = time.monotonic()
            node_bins = build_node(rel)
            print(f"node {rel.kubernetes} ({time.monotonic() - started:.1f} s): {node_bins}")
        if args.scheduler_perf:
            started = time.monotonic()
            where = build_scheduler_perf(rel)
            print(
                f"scheduler_perf (dra) {rel.kubernetes} ({time.monotonic() - started:.1f} s): "
                f"{where.parent / 'bin' / 'dra.test'}"
            )
    except BuildError as err:
        print(f"control-plane: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
