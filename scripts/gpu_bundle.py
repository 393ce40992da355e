#!/usr/bin/env python3
"""The bookkeeping of scripts/gpu_session.sh's GPU bundle, one subcommand each:

  cuda-tests TESTS_DIR          the CUDA tests of each test binary, as gtest filters
  manifest STAGING REPO ARCH    write STAGING/manifest.json (commit, sizes, source hashes)
  check BUNDLE REPO             the bundle's files and the tree it runs in against its manifest
  loads WORK LDD_LOG [LDDEBUG]  where every library resolved: inside the bundle, the machine's
                                CUDA, or its C/C++ runtime; anything else is a failure
  gtest LOG...                  passed / failed / skipped (with reasons) from gtest's output
  summary OUT WORK              OUT/summary.json from the stages' records under WORK
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import time

# Where a test binary's sources are: tests/<module>/*_test.cpp, and the gtest programs of their
# own (tests/<module>/*_main.cpp linked with gtest_main).
OWN_GTEST_MAINS = {"dist/init_method_main.cpp": "ember_dist_init_method"}
TEST_HEADER = re.compile(r"^(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\(\s*(\w+)\s*,\s*(\w+)\s*\)",
                         re.M)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CUDA_WORDS = re.compile(r"cuda|gpu|nccl|kCUDA", re.I)
# The C and C++ runtime every Linux machine brings: resolved outside the bundle on purpose.
SYSTEM_BASE = re.compile(r"^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|"
                         r"libgcc_s\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|"
                         r"libutil\.so\.1|libresolv\.so\.2|libnss_\w+\.so\.2|linux-vdso\.so\.1|"
                         r"libcuda\.so\.1|libnvidia-[\w.-]+\.so[\w.]*)$")
# CUDA's own libraries: the machine's toolkit or PyTorch's wheels, never the bundle's.
CUDA_LIBS = re.compile(r"^lib(cudart|cublas|cublasLt|cudnn\w*|nccl|nvrtc\w*|nvJitLink|curand|"
                       r"cufft|cusparse|cusolver|nvToolsExt)\.so[\w.]*$")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tracked_files(repo):
    out = subprocess.run(["git", "-C", repo, "ls-files", "-z"], check=True, capture_output=True)
    return sorted(p for p in out.stdout.decode().split("\0") if p and os.path.isfile(
        os.path.join(repo, p)))


def cuda_tests(tests_dir):
    """{binary: gtest filter} of the tests whose name or body speaks of CUDA, a GPU or NCCL
    (the layer tests' CUDA halves are LayersParity's, whose bodies say so)."""
    found = {}
    for module in sorted(os.listdir(tests_dir)):
        folder = os.path.join(tests_dir, module)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            relative = f"{module}/{name}"
            if name.endswith("_test.cpp"):
                binary = f"ember_{module}_tests"
            elif relative in OWN_GTEST_MAINS:
                binary = OWN_GTEST_MAINS[relative]
            else:
                continue
            text = open(os.path.join(folder, name), encoding="utf-8").read()
            heads = list(TEST_HEADER.finditer(text))
            for i, head in enumerate(heads):
                body = text[head.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
                kind, suite, test = head.groups()
                tests = found.setdefault(binary, {}).setdefault(suite, {})
                tests[test] = (kind, bool(CUDA_WORDS.search(body) or
                                          CUDA_WORDS.search(suite + "." + test)))
    filters = {}
    for binary, suites in sorted(found.items()):
        patterns = []
        for suite, tests in sorted(suites.items()):
            cuda = [t for t, (_, on) in tests.items() if on]
            if not cuda:
                continue
            kind = next(iter(tests.values()))[0]
            if kind in ("TEST_P",):
                names = [f"*/{suite}.*"] if len(cuda) == len(tests) else [
                    f"*/{suite}.{t}/*" for t in cuda]
            elif kind.startswith("TYPED_TEST"):
                names = [f"{suite}/*.*"] if len(cuda) == len(tests) else [
                    f"{suite}/*.{t}" for t in cuda]
            else:
                names = [f"{suite}.*"] if len(cuda) == len(tests) else [f"{suite}.{t}" for t in cuda]
            patterns += names
        if patterns:
            filters[binary] = ":".join(patterns)
    return filters


def cmd_cuda_tests(tests_dir):
    for binary, pattern in cuda_tests(tests_dir).items():
        print(f"{binary}\t{pattern}")


def cmd_manifest(staging, repo, arch):
    files = {}
    for root, _, names in os.walk(staging):
        for name in names:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, staging)
            if relative != "manifest.json":
                files[relative] = {"size": os.path.getsize(path), "sha256": sha256(path)}
    head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    kernels = sorted(set(re.findall(r"__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)",
                                    "".join(open(os.path.join(repo, "tensor/cuda", f)).read()
                                            for f in sorted(os.listdir(os.path.join(repo, "tensor/cuda")))
                                            if f.endswith(".cu")))))
    manifest = {
        "commit": head.stdout.strip(),
        "tree_dirty": bool(dirty),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cuda_architectures": arch,
        "bytes": sum(f["size"] for f in files.values()),
        "files": dict(sorted(files.items())),
        "sources": {p: sha256(os.path.join(repo, p)) for p in tracked_files(repo)},
        "cuda_kernels": kernels,
    }
    with open(os.path.join(staging, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"manifest: commit {manifest['commit'][:12]}{' (tree dirty)' if dirty else ''}, "
          f"{len(files)} files, {manifest['bytes'] / 2**20:.1f} MiB unpacked")


def cmd_check(bundle, repo):
    """Exit 1 with the reasons when a file of the bundle or of the tree differs from the manifest."""
    manifest = json.load(open(os.path.join(bundle, "manifest.json")))
    problems = []
    for relative, want in manifest["files"].items():
        path = os.path.join(bundle, relative)
        if not os.path.isfile(path):
            problems.append(f"bundle file missing: {relative}")
        elif os.path.getsize(path) != want["size"] or sha256(path) != want["sha256"]:
            problems.append(f"bundle file differs: {relative}")
    changed = [p for p, digest in manifest["sources"].items()
               if not os.path.isfile(os.path.join(repo, p)) or sha256(os.path.join(repo, p)) != digest]
    if changed:
        problems.append(f"the tree is not the one packed (commit {manifest['commit'][:12]}): "
                        f"{len(changed)} files differ, e.g. {', '.join(changed[:5])}")
    head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and head.stdout.strip() != manifest["commit"]:
        problems.append(f"the tree's commit {head.stdout.strip()[:12]} is not the bundle's "
                        f"{manifest['commit'][:12]}")
    print(json.dumps({"commit": manifest["commit"], "files": len(manifest["files"]),
                      "sources": len(manifest["sources"]), "problems": problems}))
    return 1 if problems else 0


def classify(path, work):
    name = os.path.basename(path)
    real = os.path.realpath(path)
    if real.startswith(os.path.realpath(work) + "/"):
        return "bundle"
    if SYSTEM_BASE.match(name):
        return "system"
    if CUDA_LIBS.match(name):
        return "cuda"
    return "outside"


def cmd_loads(work, ldd_log, lddebug=None):
    """ldd's answers for every ELF file of the bundle (LDD_LOG: '== FILE' then ldd's lines),
    and, where given, the objects each run program loaded (LD_DEBUG=files logs)."""
    result = {"checked": 0, "resolved": {"bundle": 0, "system": 0, "cuda": 0},
              "unresolved": [], "outside": [], "unchecked": []}
    current = None
    for line in open(ldd_log, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("== "):
            current = line[3:]
            result["checked"] += 1
            continue
        if "unchecked: the ldd check was cut" in line:
            result["checked"] -= 1
            result["unchecked"].append(current)
            continue
        missing = re.match(r"\s*(\S+) => not found", line)
        version = re.search(r"version `([^']+)' not found \(required by ([^)]+)\)", line)
        if missing:
            result["unresolved"].append(f"{missing.group(1)} (needed by {current})")
        elif version:
            result["unresolved"].append(f"symbol version {version.group(1)} (needed by "
                                        f"{version.group(2)})")
        else:
            found = re.match(r"\s*(\S+) => (/\S+) \(", line) or re.match(r"\s*(/\S+) \(", line)
            if found:
                where = classify(found.groups()[-1], work)
                if where == "outside":
                    result["outside"].append(f"{found.groups()[-1]} (needed by {current})")
                else:
                    result["resolved"][where] += 1
    if lddebug:
        loaded = 0
        for name in sorted(os.listdir(lddebug)):
            lines = open(os.path.join(lddebug, name), errors="replace").read().splitlines()
            program = next((m.group(1) for m in (re.search(r"needed by (\S+) \[0\]", l)
                                                 for l in lines) if m), None)
            # Programs of the machine (bash, timeout) the runs pass through are not the bundle's.
            if program is None or classify(program, work) != "bundle":
                continue
            for l in lines:
                init = re.search(r"calling init: (\S+)", l)
                if init:
                    loaded += 1
                    if classify(init.group(1), work) == "outside":
                        result["outside"].append(f"{init.group(1)} (loaded by {program})")
        result["loaded_at_run_time"] = loaded
    result["outside"] = sorted(set(result["outside"]))
    result["unresolved"] = sorted(set(result["unresolved"]))
    print(json.dumps(result, indent=1))
    return 1 if result["unresolved"] or result["outside"] else 0


def parse_gtest(paths):
    """{passed, failed, skipped, crashed} lists from gtest's console output (several runs,
    possibly of several ranks), skipped with their reasons."""
    out = {"passed": [], "failed": [], "skipped": {}, "crashed": []}
    for path in paths:
        running, message = None, []
        for line in open(path, errors="replace"):
            line = ANSI.sub("", line.rstrip("\n"))  # mpirun's pseudo-terminal brings colours
            start = re.match(r"\[ RUN      \] (\S+)", line)
            end = re.match(r"\[ *(OK|FAILED|SKIPPED) *\] (\S+?),? .*\(\d+ ms\)$", line)
            rank_failure = re.match(r"\[rank (\d+)\] FAILED (\S+)", line)
            if start:
                if running:
                    out["crashed"].append(running)
                running, message = start.group(1), []
            elif end and end.group(2) == running:
                kind = end.group(1)
                if kind == "OK":
                    out["passed"].append(running)
                elif kind == "FAILED":
                    out["failed"].append(running)
                else:
                    reason = " ".join(m for m in message if not m.endswith(": Skipped")).strip()
                    out["skipped"][running] = reason or "skipped"
                running = None
            elif rank_failure:
                out["failed"].append(f"{rank_failure.group(2)} (rank {rank_failure.group(1)})")
            elif running:
                message.append(line.strip())
        if running:
            out["crashed"].append(running)
    return out


def cmd_gtest(paths):
    """Counts over every run (a test run at 1 and 2 ranks counts twice), as summary.json's."""
    runs = [parse_gtest([p]) for p in paths]
    passed = sum(len(r["passed"]) for r in runs)
    failed = sum(len(r["failed"]) + len(r["crashed"]) for r in runs)
    print(f"{passed} passed, {failed} failed, {sum(len(r['skipped']) for r in runs)} skipped")
    return 1 if failed else 0


def read_json_lines(path):
    rows = []
    if os.path.isfile(path):
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    rows.append({"unparsed": line})
    return rows


def resnet_ratios(rows):
    """Each ember row's images/s over PyTorch eager's in the same group (model, batch, mode)."""
    torch = {r["group"]: r for r in rows if r.get("side") == "torch" and "images_per_s" in r}
    ratios = []
    for r in rows:
        if r.get("group") in torch and r.get("side") != "torch" and "images_per_s" in r:
            t = torch[r["group"]]
            ratios.append({"compare": "train_step", "group": r["group"], "side": r["side"],
                           "over_torch_images_per_s": round(r["images_per_s"] / t["images_per_s"], 3),
                           "peak_gpu_mem_mb": r.get("peak_gpu_mem_mb"),
                           "torch_peak_gpu_mem_mb": t.get("peak_gpu_mem_mb")})
    return ratios


def needs_two_gpus(logs, runs):
    """The NCCL tests, run at one rank and left out at two (NCCL refuses two ranks on one GPU),
    and any test skipped for want of a second GPU."""
    listed = []
    one_rank = os.path.join(logs, "ember_dist_tests_np1.log")
    if os.path.isfile(one_rank):
        r = parse_gtest([one_rank])
        ran = r["passed"] + r["failed"] + r["crashed"] + list(r["skipped"])
        listed += [f"{t} at 2 ranks" for t in sorted(ran) if "Nccl" in t]
    listed += sorted({t for r in runs.values() for k, v in r["skip_reasons"].items()
                      if re.search(r"two GPUs|2 GPUs|second GPU", k)
                      for t in (v if isinstance(v, list) else [k])})
    return listed


def cmd_summary(out, work):
    """summary.json: each stage's record (WORK/stages/*.json, written as the stage ends), the
    tests' results, the sanitizer's findings, the benchmark rows and every ratio to PyTorch."""
    summary = {"stages": {}}
    stages = os.path.join(work, "stages")
    for name in sorted(os.listdir(stages)) if os.path.isdir(stages) else []:
        record = json.load(open(os.path.join(stages, name)))
        summary["stages"][name[:-5]] = record
    for key in ("commit", "device", "mode", "versions"):
        for record in summary["stages"].values():
            if key in record:
                summary[key] = record.pop(key)
    logs = os.path.join(work, "gtest")
    if os.path.isdir(logs):
        runs = {}
        for name in sorted(os.listdir(logs)):
            r = parse_gtest([os.path.join(logs, name)])
            reasons = {}
            for test, reason in r["skipped"].items():
                reasons.setdefault(reason, []).append(test)
            runs[name[:-4]] = {"passed": len(r["passed"]), "failed": r["failed"] + [
                f"{t} (crashed)" for t in r["crashed"]], "skipped": len(r["skipped"]),
                "skip_reasons": {k: (len(v) if len(v) > 5 else v) for k, v in reasons.items()}}
        summary["tests"] = {
            "passed": sum(r["passed"] for r in runs.values()),
            "failed": sum(len(r["failed"]) for r in runs.values()),
            "skipped": sum(r["skipped"] for r in runs.values()),
            "needs_two_gpus": needs_two_gpus(logs, runs),
            "runs": runs}
    sanitizer = summary["stages"].get("sanitizer", {})
    summary["sanitizer"] = {k: sanitizer[k] for k in ("memcheck", "racecheck") if k in sanitizer}
    rows = read_json_lines(os.path.join(work, "bench.jsonl"))
    summary["bench"] = {
        "rows": [r for r in rows if "group" in r],
        "failed": [r["row"] for r in rows if "error" in r],
        "ratios_to_pytorch": [r for r in rows if any("_over_torch" in k for k in r)] +
                             resnet_ratios(rows),
        "cut": [r["row"] for r in rows if "cut" in r],
        "not_run": [f"{r['row']}: {r['not_run']}" for r in rows if "not_run" in r]}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    failed = summary.get("tests", {}).get("failed", 0)
    bad_stages = [n for n, s in summary["stages"].items() if s.get("status") == "failed"]
    stages_line = ", ".join(f"{n} {s.get('status')}" for n, s in summary["stages"].items())
    print(f"summary.json: stages {stages_line}; tests {summary.get('tests', {}).get('passed', 0)} passed, {failed} failed, "
          f"{summary.get('tests', {}).get('skipped', 0)} skipped")
    return 1 if failed or bad_stages else 0


def main(argv):
    commands = {"cuda-tests": (cmd_cuda_tests, 1), "manifest": (cmd_manifest, 3),
                "check": (cmd_check, 2), "loads": (cmd_loads, 2), "summary": (cmd_summary, 2)}
    if len(argv) >= 2 and argv[1] == "gtest":
        return cmd_gtest(argv[2:])
    if len(argv) < 2 or argv[1] not in commands or len(argv) - 2 < commands[argv[1]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    return commands[argv[1]][0](*argv[2:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
