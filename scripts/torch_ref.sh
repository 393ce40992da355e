#!/usr/bin/env bash
# The PyTorch 2.x reference of ember's CPU benchmarks: makes (once) a Python venv with the
# newest torch from PyPI, torchvision, numpy and Pillow, and prints its torch version. A
# second run finds it complete and only prints the version. The bench/*.sh comparisons run
# bench/*_torch.py under it once it is complete (scripts/torch_python.sh); EMBER_TORCH_PYTHON
# or their --python flag picks another, e.g. Debian's /usr/bin/python3 with torch 1.13.
# The tests never need it.
#
# PyPI's Linux torch wheel is a CUDA build whose libraries link the CUDA runtime libraries,
# so it does not import without them, even on a CPU. Installed here: torch without its
# dependencies, then every Linux dependency its metadata lists except the GPU-only ones
# (triton, the GPU compiler; cuda-bindings; cuSOLVER and NVTX, opened only by CUDA calls),
# the set that imports and runs eager and torch.compile (inductor's C++ kernels) on the CPU.
#
#   bash scripts/torch_ref.sh [--torch VERSION]     default: the newest on PyPI
#
# Environment:
#   EMBER_TORCH_REF_VENV   where the venv lives (default: .venv-torch-ref at the repo root;
#                          git ignores it). Pointing several checkouts at one saves the download.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/phase.sh
source "$repo_root/scripts/phase.sh"
# shellcheck source=scripts/debian_packages.sh
source "$repo_root/scripts/debian_packages.sh"
# shellcheck source=scripts/torch_python.sh
source "$repo_root/scripts/torch_python.sh"
torch_spec=torch
while (($#)); do
  case "$1" in
    --torch) torch_spec="torch==$2"; shift 2 ;;
    -h | --help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "torch_ref.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
venv="$(torch_ref_venv)"
python="$venv/bin/python"
complete="$(torch_ref_complete)"  # written last: without it the venv is made again

if [[ ! -f "$complete" ]]; then
  # venv and pip; g++ and Python's headers for torch.compile's C++ kernels.
  phase packages "checking the Debian packages of the venv and of torch.compile"
  install_missing_packages torch_ref.sh python3-venv python3-dev g++
  phase_done "${#missing_packages[@]} installed"

  phase venv "$venv with $torch_spec from PyPI"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"  # Debian's Python (python3-venv)
  "$python" -m pip install --quiet --upgrade pip packaging
  "$python" -m pip install --no-deps "$torch_spec"
  # torch's Linux dependencies from its metadata, less the GPU-only ones (see above).
  mapfile -t deps < <("$python" - <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement

for req in map(Requirement, requires("torch")):
    if (req.marker and not req.marker.evaluate({"extra": ""})) or req.name in ("triton", "cuda-bindings"):
        continue
    extras = sorted(req.extras - {"cusolver", "nvtx"})
    print(req.name + (f"[{','.join(extras)}]" if extras else "") + str(req.specifier))
PY
  )
  # The pinned CUDA toolkit pieces first: cuDNN's unpinned nvidia-cublas then finds the
  # pinned one installed (else pip fetches the newest and backtracks). pip then warns that
  # triton and cuda-bindings are missing: left out on purpose.
  toolkit=()
  rest=()
  for dep in "${deps[@]}"; do
    if [[ "$dep" == cuda-toolkit* ]]; then toolkit+=("$dep"); else rest+=("$dep"); fi
  done
  ((${#toolkit[@]} == 0)) || "$python" -m pip install "${toolkit[@]}"
  "$python" -m pip install "${rest[@]}" numpy pillow
  # torchvision without its dependencies: they would pull torch's GPU-only ones back.
  "$python" -m pip install --no-deps torchvision
  "$python" - <<'PY'
from importlib.metadata import requires, version
from packaging.requirements import Requirement

wanted = [Requirement(r) for r in requires("torchvision") if r.startswith("torch")]
assert all(version("torch") in r.specifier for r in wanted), f"torchvision wants {wanted}, torch is {version('torch')}"
PY
  # torch.compile links its C++ kernels with Python's LIBDIR named before torch's own lib
  # folder; Debian's Python has /usr/lib/x86_64-linux-gnu there, where python3-torch puts
  # libtorch 1.13, so the kernels linked that libtorch, failed to load, and inductor fell
  # back to scalar code (pick_vec_isa() said INVALID_VEC_ISA). The venv's compiler command
  # names this torch's lib folder first, and the venv sets CXX to it unless CXX is set.
  torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  printf '#!/bin/sh\n# g++ that links the venv'"'"'s libtorch first (scripts/torch_ref.sh)\nexec g++ -L"%s" "$@"\n' \
    "$torch_lib" >"$venv/bin/torch-ref-cxx"
  chmod +x "$venv/bin/torch-ref-cxx"
  site="$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  echo "import os; os.environ.setdefault('CXX', '$venv/bin/torch-ref-cxx')" >"$site/ember-torch-ref-cxx.pth"
  phase_done "$(du -sh "$venv" | cut -f1) on disk"

  phase check "eager and torch.compile on the CPU"
  # A cache of its own: kernels another venv compiled into the shared default cache may not
  # load into this one.
  cache="$(mktemp -d)"
  TORCHINDUCTOR_CACHE_DIR="$cache" "$python" - <<'PY'
import torch
import torchvision  # noqa: F401
from torch._inductor import cpu_vec_isa

# Vectorised kernels where the CPU has AVX2 or AVX-512 (inductor's own probe).
with open("/proc/cpuinfo") as f:
    flags = f.read().split()
if "avx2" in flags or "avx512f" in flags:
    assert cpu_vec_isa.pick_vec_isa(), "torch.compile's kernels do not build or load vectorised"
x = torch.randn(64, 64)
f = torch.compile(lambda t: torch.nn.functional.gelu(t) * 2)
torch.testing.assert_close(f(x), torch.nn.functional.gelu(x) * 2)
PY
  rm -rf "$cache"
  phase_done
  touch "$complete"
fi
"$python" - <<'PY'
import sys

import torch
import torchvision

print(f"torch {torch.__version__}, torchvision {torchvision.__version__}: {sys.executable}")
PY
