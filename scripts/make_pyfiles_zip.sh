#!/usr/bin/env bash
# Zip the bigdl_py package for spark-submit --py-files (Spark puts the zip on every executor's
# Python path; see docs/deploy.md). Prints the zip's path.
#
#   scripts/make_pyfiles_zip.sh [OUTPUT]    default OUTPUT: dist/bigdl_py-<version>-pyfiles.zip
#
# Only the Python sources go in: the executors must already have bigdl_py's dependencies
# (numpy, pyarrow, threadpoolctl; cupy for GPUs), as with any --py-files shipment.
set -euo pipefail

repo_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo_dir/pyproject.toml" | head -n 1)"
output="${1:-$repo_dir/dist/bigdl_py-${version:-dev}-pyfiles.zip}"
mkdir -p "$(dirname "$output")"
output="$(cd "$(dirname "$output")" && pwd)/$(basename "$output")"

# Python's zipfile, not the zip tool (not on every machine); sorted names and a fixed date
# make the archive byte-for-byte reproducible.
"$python" - "$repo_dir" "$output" <<'PY'
import os
import sys
import zipfile

repo_dir, output = sys.argv[1], sys.argv[2]
package_dir = os.path.join(repo_dir, "bigdl_py")
names = []
for folder, subfolders, files in os.walk(package_dir):
    subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
    names += [os.path.join(folder, name) for name in files if name.endswith(".py")]
tmp_output = output + ".tmp"
with zipfile.ZipFile(tmp_output, "w", zipfile.ZIP_DEFLATED) as archive:
    for path in sorted(names):
        entry = zipfile.ZipInfo(os.path.relpath(path, repo_dir), date_time=(1980, 1, 1, 0, 0, 0))
        entry.compress_type = zipfile.ZIP_DEFLATED
        entry.external_attr = 0o644 << 16
        with open(path, "rb") as source:
            archive.writestr(entry, source.read())
os.replace(tmp_output, output)
PY
echo "$output"
