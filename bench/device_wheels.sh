#!/usr/bin/env bash
# Fills bench/wheels/ (git-ignored) with every wheel the pipeline needs on the GPU machine
# that its image lacks: that machine has CPython 3.12 (/opt/torch/.venv) with torch,
# transformers, numpy, ... (IMAGE below) and no network, so the rest travels as wheels.
#   bash bench/device_wheels.sh        # here, with network; then bench/device_setup.sh there
# Roots: pyproject.toml [project].dependencies, plus gguf and zstandard==0.25.0. The closure
# follows each wheel's METADATA Requires-Dist, evaluated for Linux x86_64 CPython 3.12
# (extras only where a requirement asks for them); versions are those .venv has installed
# (what CI tests), else the newest wheel that matches. One version per package: wheels
# of other versions or of packages no longer needed are removed. Re-running re-uses what
# is already downloaded. A package with no wheel on the index (connection_pool 0.0.3, an
# sdist) is built here with pip wheel, and kept only if pure Python. Exits non-zero on an
# unresolved requirement or a total >= 40 MiB. bench/wheels is git-ignored: a device run
# must carry it (run tool: carry=["bench/wheels"]).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
wheels=bench/wheels
venv_pip=${VENV_PIP:-.venv/bin/pip}
mkdir -p "$wheels"
freeze=$(mktemp)
trap 'rm -f "$freeze"' EXIT
"$venv_pip" list --format=freeze >"$freeze"

python3 - "$wheels" "$freeze" <<'PY'
import email.parser
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name, parse_wheel_filename
    from packaging.version import Version
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
    from pip._vendor.packaging.version import Version

wheels = Path(sys.argv[1]).resolve()
freeze = Path(sys.argv[2])

# Already in the device image (/opt/torch/.venv): never downloaded.
IMAGE = {canonicalize_name(n) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
certifi charset-normalizer click cloudpickle colorama contourpy cycler filelock fonttools
frozenlist fsspec h11 h5py hf-xet httpcore httpx huggingface-hub humanize idna iniconfig
jinja2 joblib kiwisolver markdown markdown-it-py markupsafe matplotlib mdurl ml-dtypes
mpmath msgpack multidict networkx numpy packaging pandas pathspec pillow pip pluggy
propcache protobuf psutil pyarrow pygments pyparsing pytest python-dateutil pyyaml regex
requests rich safetensors scipy sentencepiece setuptools shellingham six sortedcontainers
sympy tabulate tiktoken tokenizers toolz torch tqdm transformers triton typer
typing-extensions typing-inspect urllib3 uvloop werkzeug wheel wrapt xxhash yarl zipp
""".split()}

# Extra roots beyond pyproject's dependencies (explicit pins win over .venv's).
EXTRA_ROOTS = ["gguf", "zstandard==0.25.0"]

ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3",
    "implementation_name": "cpython", "implementation_version": "3.12.3",
    "platform_python_implementation": "CPython", "sys_platform": "linux",
    "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
    "platform_release": "", "platform_version": "",
}

PIP = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
       "--python-version", "3.12", "--implementation", "cp",
       "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
       "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
       "--platform", "manylinux1_x86_64", "--disable-pip-version-check", "-d", str(wheels)]

pins = {}
for line in freeze.read_text().splitlines():
    if "==" in line:
        name, version = line.split("==", 1)
        pins[canonicalize_name(name)] = version.split("+")[0]

pyproject = tomllib.loads(Path("pyproject.toml").read_text())
roots = [(Requirement(r), "pyproject.toml") for r in pyproject["project"]["dependencies"]]
roots += [(Requirement(r), "device_wheels.sh") for r in EXTRA_ROOTS]
explicit = {canonicalize_name(r.name): s.version
            for r, who in roots if who == "device_wheels.sh" for s in r.specifier if s.operator == "=="}

wanted = {}        # name -> [(Requirement, who asked)]
extras = {}        # name -> set of extras asked for
resolved = {}      # name -> Path of its wheel
processed = {}     # name -> extras its metadata was read with
problems = []


def applies(req, extra=""):
    return req.marker is None or req.marker.evaluate({**ENV, "extra": extra})


def add(req, who):
    name = canonicalize_name(req.name)
    wanted.setdefault(name, []).append((req, who))
    extras.setdefault(name, set()).update(req.extras)


for r, who in roots:
    if applies(r):
        add(r, who)


def wheel_of(path):
    name, version, _, _ = parse_wheel_filename(path.name)
    return canonicalize_name(name), version


def requires(path, with_extras):
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist()
                    if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        msg = email.parser.HeaderParser().parsestr(z.read(meta).decode())
    out = []
    for line in msg.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if any(applies(req, e) for e in ["", *sorted(with_extras)]):
            out.append(req)
    return out


def target(name):
    """pip requirement string for a package: explicit pin, .venv's version, or a range."""
    spec = SpecifierSet()
    for req, _ in wanted[name]:
        spec &= req.specifier
    version = explicit.get(name) or pins.get(name)
    if version is not None:
        if not spec.contains(version, prereleases=True):
            problems.append(f"{name}=={version} (pinned) does not satisfy {spec} "
                            f"asked by {sorted({w for _, w in wanted[name]})}")
        return f"{name}=={version}"
    print(f"device_wheels: {name} is not in .venv; taking the newest wheel for '{spec}'",
          file=sys.stderr)
    return f"{name}{spec}"


def download(reqs):
    """pip download; returns {name: Path}. Falls back to one at a time to name a failure."""
    got = {}

    def run(batch):
        p = subprocess.run(PIP + batch, capture_output=True, text=True)
        for line in p.stdout.splitlines():
            line = line.strip()
            for lead in ("Saved ", "File was already downloaded "):
                if line.startswith(lead) and line.endswith(".whl"):
                    path = (Path.cwd() / line[len(lead):]).resolve()
                    got[wheel_of(path)[0]] = path
        return p

    p = run(reqs)
    if p.returncode != 0:
        for r in reqs:
            q = run([r])
            if q.returncode != 0:
                path = build_pure(r)
                if path is not None:
                    got[wheel_of(path)[0]] = path
                else:
                    problems.append(f"pip download {r} failed: "
                                    + (q.stderr.strip().splitlines() or ["?"])[-1])
    return got


def pure(path):
    tags = parse_wheel_filename(path.name)[3]
    return any(t.abi == "none" and t.platform == "any" and t.interpreter in ("py3", "py312") for t in tags)


def build_pure(r):
    """An sdist-only package (connection_pool) as a wheel built here: only a pure-Python one."""
    req = Requirement(r)
    pinned = [s.version for s in req.specifier if s.operator == "=="]
    if not pinned:
        return None
    name, version = canonicalize_name(req.name), Version(pinned[0])

    def found():
        return [w for w in wheels.glob("*.whl") if wheel_of(w) == (name, version) and pure(w)]

    if not found():
        print(f"device_wheels: {r} has no wheel on the index; building it from its sdist", file=sys.stderr)
        b = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-binary", req.name,
                            "--disable-pip-version-check", "-w", str(wheels), r],
                           capture_output=True, text=True)
        if b.returncode != 0:
            problems.append(f"building {r} failed: " + (b.stderr.strip().splitlines() or ["?"])[-1])
            return None
    built = [w for w in wheels.glob("*.whl") if wheel_of(w) == (name, version)]
    if not found():
        problems.append(f"{r}: the wheel built from its sdist is not pure Python: {[w.name for w in built]}")
        for w in built:
            w.unlink()
        return None
    return found()[0].resolve()


while True:
    todo = sorted(n for n in wanted if n not in IMAGE and n not in resolved)
    if todo:
        targets = {n: target(n) for n in todo}
        got = download(list(targets.values()))
        for n in todo:
            if n in got:
                resolved[n] = got[n]
            else:
                problems.append(f"no wheel for {targets[n]}")
                resolved[n] = None
    again = [n for n, path in resolved.items()
             if path is not None and processed.get(n) != extras.get(n, set())]
    if not todo and not again:
        break
    for n in again:
        processed[n] = set(extras.get(n, set()))
        for req in requires(resolved[n], processed[n]):
            add(req, n)

# One version per package: drop every other wheel in the folder.
keep = {p for p in resolved.values() if p is not None}
for stale in sorted(wheels.glob("*.whl")):
    if stale.resolve() not in keep:
        print(f"device_wheels: removing {stale.name} (not in the set)", file=sys.stderr)
        stale.unlink()

# Check: every requirement of every wheel is met by a wheel here or by the image.
versions = {n: wheel_of(p)[1] for n, p in resolved.items() if p is not None}
image_needs = {}
for n, path in sorted(resolved.items()):
    if path is None:
        continue
    for req in requires(path, extras.get(n, set())):
        dep = canonicalize_name(req.name)
        if dep in versions:
            if not req.specifier.contains(versions[dep], prereleases=True):
                problems.append(f"{n} needs {req}, have {dep}=={versions[dep]}")
        elif dep in IMAGE:
            if str(req.specifier) or req.extras:
                image_needs.setdefault(dep, set()).add(f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}{req.specifier} ({n})")
        else:
            problems.append(f"{n} needs {req}: neither a wheel here nor in the image")
for dep, items in sorted(extras.items()):
    if dep in IMAGE and items:
        print(f"device_wheels: note: image package {dep} is asked for with extras {sorted(items)}; "
              "their requirements are assumed to be in the image", file=sys.stderr)

print(f"{'package':36} {'version':14} {'KiB':>7}  wheel")
total = 0
for n in sorted(versions):
    size = resolved[n].stat().st_size
    total += size
    print(f"{n:36} {str(versions[n]):14} {size // 1024:7}  {resolved[n].name}")
print(f"{len(versions)} wheels, {total / 2**20:.2f} MiB in {wheels}")
if image_needs:
    print("Version constraints on image packages (check against the image; bench/device_setup.sh does):")
    for dep in sorted(image_needs):
        print(f"  {dep}: " + "; ".join(sorted(image_needs[dep])))
status = 0
for p in problems:
    print(f"device_wheels: UNRESOLVED: {p}", file=sys.stderr)
    status = 1
if total >= 40 * 2**20:
    print(f"device_wheels: TOO BIG: {total / 2**20:.2f} MiB (limit 40 MiB)", file=sys.stderr)
    status = 1
elif total >= 32 * 2**20:
    print(f"device_wheels: warning: {total / 2**20:.2f} MiB is close to the 40 MiB limit", file=sys.stderr)
sys.exit(status)
PY
