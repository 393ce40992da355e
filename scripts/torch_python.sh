# shellcheck shell=bash
# Sourced by scripts/torch_ref.sh and the bench/*.sh comparisons: where the PyTorch 2.x venv
# lives, and which Python runs the bench/*_torch.py references.

torch_ref_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# torch_ref_venv: the venv scripts/torch_ref.sh makes (EMBER_TORCH_REF_VENV, default
# .venv-torch-ref at the repo root).
torch_ref_venv() { echo "${EMBER_TORCH_REF_VENV:-$torch_ref_repo/.venv-torch-ref}"; }

# torch_ref_complete: the file torch_ref.sh writes last; a venv without it was cut short.
torch_ref_complete() { echo "$(torch_ref_venv)/.ember-torch-ref-complete"; }

# torch_python: EMBER_TORCH_PYTHON when set, else the venv's python when the venv is
# complete, else Debian's /usr/bin/python3 (python3-torch, PyTorch 1.13).
torch_python() {
  if [[ -n "${EMBER_TORCH_PYTHON:-}" ]]; then
    echo "$EMBER_TORCH_PYTHON"
  elif [[ -f "$(torch_ref_complete)" ]]; then
    echo "$(torch_ref_venv)/bin/python"
  else
    echo /usr/bin/python3
  fi
}
