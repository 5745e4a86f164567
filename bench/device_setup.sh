# On the GPU machine (no network; python3 is /opt/torch/.venv's 3.12), from the repo root:
# installs the wheels that bench/device_wheels.sh put in bench/wheels into /tmp/site and
# sets up the environment the pipeline runs in. Either
#   . bench/device_setup.sh                 # sourced: exports into this shell
#   eval "$(bash bench/device_setup.sh)"    # run: prints the export lines on stdout
# It exports PYTHONPATH=/tmp/site:$PWD/src and puts /tmp/site/bin (snakemake, and a
# `draftsmith` wrapper) first on PATH. Everything else goes to stderr. It fails (exit or
# return 1, with a message) if a wheel does not install or snakemake, gguf, zstandard or
# draftsmith does not import; version mismatches against the image are only warned about.
# A second run with the same wheels skips the install. DEVICE_SITE overrides /tmp/site.

_device_setup() {
    local site root py stamp f
    site=${DEVICE_SITE:-/tmp/site}
    root=$PWD
    py=$(command -v python3) || { echo "device_setup: FAILED: no python3 on PATH" >&2; return 1; }
    if [ ! -f "$root/pyproject.toml" ] || [ ! -d "$root/src/draftsmith" ]; then
        echo "device_setup: FAILED: run it from the draftsmith repo root (not $root)" >&2
        return 1
    fi
    set -- "$root"/bench/wheels/*.whl
    if [ ! -e "$1" ]; then
        echo "device_setup: FAILED: no wheels in bench/wheels: run bench/device_wheels.sh" \
            "where there is network, and carry bench/wheels (it is git-ignored)" >&2
        return 1
    fi
    stamp=$(for f in "$@"; do echo "${f##*/} $(wc -c <"$f")"; done | cksum)
    if [ "$(cat "$site/.device_setup.stamp" 2>/dev/null)" != "$stamp" ]; then
        echo "device_setup: installing $# wheels into $site" >&2
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --disable-pip-version-check --target "$site" "$@" >&2 || {
            echo "device_setup: FAILED: pip install --target $site bench/wheels/*.whl" >&2
            return 1
        }
        echo "$stamp" >"$site/.device_setup.stamp"
    else
        echo "device_setup: $site already has these $# wheels" >&2
    fi

    # Console scripts: snakemake (its shebang is this python3) and the project's own command.
    mkdir -p "$site/bin"
    printf '#!/bin/sh\nexec "%s" -m draftsmith "$@"\n' "$py" >"$site/bin/draftsmith"
    chmod +x "$site/bin/draftsmith"
    command -v python >/dev/null 2>&1 || ln -sf "$py" "$site/bin/python"

    _ds_pythonpath="$site:$root/src"
    _ds_bin="$site/bin"
    _ds_git=""
    command -v git >/dev/null 2>&1 || _ds_git=quiet  # GitPython refuses to import without git

    if ! PYTHONPATH="$_ds_pythonpath" PATH="$_ds_bin:$PATH" ${_ds_git:+GIT_PYTHON_REFRESH=quiet} \
        "$py" -c "import snakemake, snakemake.cli, gguf, zstandard, jsonschema, pulp, draftsmith" >&2; then
        echo "device_setup: FAILED: import snakemake, snakemake.cli, gguf, zstandard, jsonschema," \
            "pulp, draftsmith with PYTHONPATH=$_ds_pythonpath ($py)" >&2
        return 1
    fi
    # Every installed wheel's requirements, and pyproject's dependencies, against what is
    # installed (the image + /tmp/site).
    PYTHONPATH="$_ds_pythonpath" "$py" - "$site" >&2 <<'PY' || true
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

site = Path(sys.argv[1])
bad = 0
project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
wants = [("pyproject.toml", r) for r in project["dependencies"]]
for dist in metadata.distributions(path=[str(site)]):
    wants += [(dist.metadata["Name"], r) for r in dist.requires or []]
for who, line in wants:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have, prereleases=True):
        bad += 1
        print(f"device_setup: warning: {who} needs {req}, "
              f"{'missing' if have is None else 'have ' + have}")
if bad:
    print(f"device_setup: warning: {bad} unmet requirement(s) above (imports passed)")
PY
    if ! PYTHONPATH="$_ds_pythonpath" "$py" -c "import datasets" 2>/dev/null; then
        echo "device_setup: warning: 'import datasets' fails (only the datasets fallback in" \
            "draftsmith.formats.datasets needs it)" >&2
    fi
    echo "device_setup: ok ($("$py" --version 2>&1), snakemake $(PYTHONPATH="$_ds_pythonpath" \
        "$py" -c 'import snakemake; print(snakemake.__version__)'))" >&2
}

if (return 0 2>/dev/null); then
    # sourced: export into the caller's shell; no set -e, no exit
    if _device_setup; then
        export PYTHONPATH="$_ds_pythonpath" PATH="$_ds_bin:$PATH"
        [ -z "$_ds_git" ] || export GIT_PYTHON_REFRESH=quiet
        echo "export PYTHONPATH=$PYTHONPATH" >&2
        unset -f _device_setup
        unset _ds_pythonpath _ds_bin _ds_git
    else
        unset -f _device_setup
        unset _ds_pythonpath _ds_bin _ds_git
        return 1
    fi
else
    _device_setup || exit 1
    echo "export PYTHONPATH=$_ds_pythonpath"
    echo "export PATH=$_ds_bin:\$PATH"
    [ -z "$_ds_git" ] || echo "export GIT_PYTHON_REFRESH=quiet"
fi
