#!/usr/bin/python3
"""ember beside PyTorch 2.x on the CPU, eager and torch.compile: every side-by-side benchmark
of bench/ (ResNet-20 and ResNet-18 training steps in fp32, channels_last and bf16 autocast,
the GPT step, the attention kernel, layer_norm and gelu, the optimizer step, the loader, DDP
at 2 ranks), run --runs times, one pass of every benchmark after another (ember and PyTorch
back to back in each). Writes one JSON file (commit, date, machine, versions, every run's
JSON lines and figures, medians and ratios) and prints the README's markdown table from it.
bash bench/compare_torch2.sh makes PyTorch's venv (scripts/torch_ref.sh) and runs this.

    /usr/bin/python3 bench/compare_torch2.py --python VENV/bin/python [--build build]
        [--runs 3] [--quick] [--only ID,...] [--out FILE] [--deadline-min 17]
    /usr/bin/python3 bench/compare_torch2.py --table FILE   # the table of a results file

No bench starts that would end after --deadline-min (17 by default, timed by the bench's
previous run; in run 1, none starts after it), so that the whole comparison ends within 20
minutes: the file then holds fewer runs of the rest and says where it stopped. Figures: the median over the runs. Speed ratios are PyTorch's time
over ember's (or ember's throughput over PyTorch's): above 1, ember is faster; each is the
median of the runs' ratios, both sides of a ratio measured in the same pass. torch.compile's
compilation is reported apart from the step: compile_s is the first call's extra time over the
median call; the first run compiles with an empty inductor cache (cold), later runs find its
kernels cached (warm). Peak memory is the process's ru_maxrss on both sides (rank 0 under DDP;
with torch.compile it holds the compilation's memory too).
"""
import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LEGACY_PYTHON = "/usr/bin/python3"  # Debian's python3-torch (1.13): continuity rows only
SIDES = ("ember", "torch_eager", "torch_compile", "torch_legacy")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


class Bench:
    """One comparison: the commands of each side and how their JSON lines become rows.

    commands: side -> argv ("{py}" stands for PyTorch's Python, "{build}" for the build
    folder); extract(side, lines) -> {row id: {side: figures}}, figures holding "value" (the
    compared figure) and what else the row shows (peak_rss_mb, compile_s, ...)."""

    def __init__(self, bench_id, commands, extract, rows):
        self.id, self.commands, self.extract, self.rows = bench_id, commands, extract, rows


def figures(line, value_key, *extra):
    out = {"value": line[value_key]}
    out.update({k: line[k] for k in extra if k in line})
    return out


def train_step_bench(model, variant, steps, threads):
    flags = {"fp32": [], "channels_last": ["--channels-last"], "bf16": ["--precision", "bf16"]}[variant]
    common = ["--model", model, "--batch", "128", "--threads", str(threads), "--steps", str(steps)] + flags
    torch = ["{py}", os.path.join(HERE, "train_step_torch.py")] + common
    commands = {"ember": ["{build}/bench/train_step"] + common, "torch_eager": torch,
                "torch_compile": torch + ["--compile"]}
    if model == "resnet20" and variant == "fp32":
        commands["torch_legacy"] = [LEGACY_PYTHON] + torch[1:]
    row = f"{model}_{variant}"

    def extract(side, lines):
        return {row: {side: figures(lines[-1], "step_s", "images_per_s", "peak_rss_mb", "compile_s")}}

    names = {"resnet20": "ResNet-20", "resnet18": "ResNet-18"}
    what = {"fp32": "fp32", "channels_last": "fp32 channels_last", "bf16": "bf16 autocast"}[variant]
    return Bench(row, commands, extract,
                 {row: {"title": f"{names[model]} train step, {what}, batch 128", "unit": "s",
                        "lower_is_better": True, "flags": " ".join(["--model", model] + flags)}})


def gpt_bench(steps, threads):
    common = ["--threads", str(threads), "--batch", "8", "--steps", str(steps)]
    torch = ["{py}", os.path.join(HERE, "gpt_step_torch.py")] + common

    def extract(side, lines):
        return {"gpt": {side: figures(lines[-1], "step_s", "tokens_per_s", "peak_rss_mb", "compile_s")}}

    return Bench("gpt", {"ember": ["{build}/bench/gpt_step"] + common, "torch_eager": torch,
                         "torch_compile": torch + ["--compile"],
                         "torch_legacy": [LEGACY_PYTHON] + torch[1:]}, extract,
                 {"gpt": {"title": "GPT train step (6 x 384, block 256, batch 8; PyTorch: fused SDPA)",
                          "unit": "s", "lower_is_better": True, "flags": ""}})


def attention_bench(threads):
    common = ["--threads", str(threads)]

    def extract(side, lines):
        impl = "ember_fused" if side == "ember" else "torch_sdpa"
        return {f"attention_{l['pass']}": {side: figures(l, "ms")} for l in lines if l["impl"] == impl}

    rows = {f"attention_{p}": {"title": f"scaled-dot-product attention {t} (B 4, H 6, L 256, D 64, causal)",
                               "unit": "ms", "lower_is_better": True, "flags": ""}
            for p, t in (("forward", "forward"), ("forward_backward", "forward + backward"))}
    return Bench("attention", {
        "ember": ["{build}/bench/attention_bench", "--no-composed"] + common,
        "torch_eager": ["{py}", os.path.join(HERE, "attention_torch.py"), "--impl", "sdpa"] + common},
        extract, rows)


def gpt_layers_bench(threads):
    common = ["--threads", str(threads)]
    torch = ["{py}", os.path.join(HERE, "gpt_layers_torch.py")] + common

    def extract(side, lines):
        return {f"{l['op']}_{l['pass']}": {side: figures(l, "ms", "compile_s")} for l in lines}

    rows = {}
    for op, shape in (("layer_norm", "[2048, 768]"), ("gelu", "[2048, 3072]"), ("gelu_tanh", "[2048, 3072]")):
        for p, t in (("forward", "forward"), ("forward_backward", "forward + backward")):
            rows[f"{op}_{p}"] = {"title": f"{op} {shape} {t}", "unit": "ms", "lower_is_better": True,
                                 "flags": ""}
    return Bench("gpt_layers", {"ember": ["{build}/bench/gpt_layers_bench"] + common,
                                "torch_eager": torch, "torch_compile": torch + ["--compile"]}, extract, rows)


OPTIMIZERS = ("sgd_nesterov", "adamw")  # the ResNet recipe's and the GPT recipe's


def optim_bench(threads):
    common = ["--model", "resnet18", "--threads", str(threads)]

    def extract(side, lines):
        rows = {}
        for l in lines:
            if l["optimizer"] not in OPTIMIZERS:
                continue
            row = rows.setdefault(f"optim_{l['optimizer']}", {})
            row["ember" if side == "ember" else "torch_eager"] = figures(l, "foreach_ms", "per_param_ms")
            if "compiled_ms" in l:
                row["torch_compile"] = figures(l, "compiled_ms", "compile_s")
        return rows

    rows = {f"optim_{o}": {"title": f"optimizer step {o}, ResNet-18's 11.2M parameters (foreach)",
                           "unit": "ms", "lower_is_better": True, "flags": ""} for o in OPTIMIZERS}
    # One PyTorch run gives both: the eager foreach step and the compiled one.
    return Bench("optim", {"ember": ["{build}/bench/optim_bench", "--optimizer", ",".join(OPTIMIZERS)] + common,
                           "torch_compile": ["{py}", os.path.join(HERE, "optim_torch.py"), "--compile",
                                             "--optimizer", ",".join(OPTIMIZERS)] + common},
                 extract, rows)


def loader_bench(quick):
    flag = ["--quick"] if quick else []

    def extract(side, lines):
        return {f"loader_w{l['workers']}": {side: figures(l, "images_per_s")} for l in lines}

    rows = {f"loader_w{w}": {"title": f"loader, CIFAR crop + flip + normalize, batch 128, {w} worker{'s' * (w > 1)}",
                             "unit": "img/s", "lower_is_better": False, "flags": ""} for w in (1, 2)}
    return Bench("loader", {"ember": ["{build}/bench/loader_bench"] + flag,
                            "torch_eager": ["{py}", os.path.join(HERE, "loader_torchvision.py")] + flag},
                 extract, rows)


def ddp_bench(steps):
    common = ["--ddp", "--threads", "1", "--steps", str(steps)]
    torch = MPIRUN + ["{py}", os.path.join(HERE, "train_step_torch.py")] + common

    def extract(side, lines):
        return {"ddp": {side: figures(lines[-1], "step_s", "ddp_over_no_sync", "peak_rss_mb", "compile_s")}}

    return Bench("ddp", {"ember": MPIRUN + ["{build}/bench/train_step"] + common, "torch_eager": torch,
                         "torch_compile": torch + ["--compile"]}, extract,
                 {"ddp": {"title": "DDP ResNet-20 train step, 2 ranks x 1 thread, batch 128 each (PyTorch: gloo)",
                          "unit": "s", "lower_is_better": True, "flags": ""}})


def benches(quick):
    """Every comparison, in the order of a pass: ResNet-18, the costliest, last (a pass the
    deadline cuts short loses it first)."""
    variants = ("fp32", "channels_last", "bf16")
    return ([train_step_bench("resnet20", v, 2 if quick else 10, 2) for v in variants]
            + [gpt_bench(1 if quick else 3, 2), attention_bench(2), gpt_layers_bench(2), optim_bench(2),
               loader_bench(quick), ddp_bench(2 if quick else 10)]
            + [train_step_bench("resnet18", v, 1 if quick else 2, 2) for v in variants])


def children_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_side(argv, env, timeout):
    """Runs one side; returns (JSON lines, wall seconds, CPU seconds, error or None). The CPU
    seconds against the wall seconds show how much of the machine the side had."""
    start, cpu = time.perf_counter(), children_cpu_s()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return [], time.perf_counter() - start, children_cpu_s() - cpu, f"timed out after {timeout} s"
    seconds, cpu = time.perf_counter() - start, children_cpu_s() - cpu
    if done.returncode != 0:
        return [], seconds, cpu, f"exit {done.returncode}: {done.stderr.strip()[-600:]}"
    lines = json_lines(done.stdout)
    return lines, seconds, cpu, None if lines else "no JSON line: " + done.stderr.strip()[-600:]


def output(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def torch_version(python):
    """(version, peak RSS in MB right after import torch), or (None, None)."""
    text = output([python, "-c", "import resource, torch; "
                   "print(torch.__version__, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"])
    return (text.split()[0], round(float(text.split()[1]), 1)) if text else (None, None)


def machine():
    info = {"platform": platform.platform(), "cores": os.cpu_count()}
    with open("/proc/cpuinfo") as f:
        cpu = f.read()
    for line in cpu.splitlines():
        if line.startswith("model name"):
            info["cpu"] = line.split(":", 1)[1].strip()
            break
    flags = set(next((l.split(":", 1)[1].split() for l in cpu.splitlines() if l.startswith("flags")), []))
    info["isa"] = sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    with open("/proc/meminfo") as f:
        info["mem_gb"] = round(int(f.readline().split()[1]) / 2**20, 1)
    return info


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def summarize(results):
    """Medians, ranges and ratios of every row, from results["runs"]."""
    summary = {}
    for row_id, meta in results["rows"].items():
        per_run = [run["rows"].get(row_id, {}) for run in results["runs"]]
        row = {}
        for side in SIDES:
            figs = [r[side] for r in per_run if side in r]
            if not figs:
                continue
            values = [f["value"] for f in figs]
            s = {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}
            rss = [f["peak_rss_mb"] for f in figs if "peak_rss_mb" in f]
            if rss:
                s["peak_rss_mb"] = statistics.median(rss)
            compile_s = [r[side].get("compile_s") if side in r else None for r in per_run]
            if compile_s[0] is not None:
                s["compile_s_cold"] = compile_s[0]  # run 1: the inductor cache was empty
            warm = [c for c in compile_s[1:] if c is not None]
            if warm:
                s["compile_s_warm"] = statistics.median(warm)
            row[side] = s
        for side in SIDES[1:]:
            ratios = [speed(r["ember"]["value"], r[side]["value"], meta["lower_is_better"])
                      for r in per_run if "ember" in r and side in r]
            if ratios:
                row[f"ember_speed_over_{side}"] = {"median": round(statistics.median(ratios), 3),
                                                   "min": round(min(ratios), 3), "max": round(max(ratios), 3)}
        summary[row_id] = row
    return summary


def speed(ember, other, lower_is_better):
    return other / ember if lower_is_better else ember / other


def fmt(value, unit):
    if unit == "img/s":
        return f"{value:,.0f} img/s".replace(",", " ")
    if unit == "s":
        return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"
    return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"


def table(results):
    """The README's markdown table."""
    v = results["versions"]
    new, old = v.get("torch"), v.get("torch_legacy")
    lines = [
        f"ember at {results['commit'][:9]} beside PyTorch {new} (PyPI, `scripts/torch_ref.sh`) eager and "
        f"`torch.compile`, and Debian's PyTorch {old} eager where it continues earlier rows; "
        f"{results['machine'].get('cpu', '?')}, {results['machine']['cores']} cores, {results['date']}, "
        f"median of {len(results['runs'])} run(s), load average {results['load'][0]:.1f} at the start. "
        f"Speed: PyTorch's time over ember's (above 1: ember is faster; ranges over the runs). "
        f"Compile: the first call's extra time, cold (empty cache) / warm (cached kernels). "
        f"Peak RSS: ru_maxrss, of which `import torch` alone holds "
        f"{results.get('import_rss_mb', {}).get('torch')} MB in {new} and "
        f"{results.get('import_rss_mb', {}).get('torch_legacy')} MB in {old}.",
        "",
        f"| benchmark | ember | PyTorch {new} eager | PyTorch {new} compiled | ember speed vs eager "
        f"| vs compiled | compile s cold / warm | peak RSS MB ember / eager / compiled | PyTorch {old} |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    # The training steps together (a pass runs ResNet-18's last).
    ordered = sorted(results["rows"].items(), key=lambda item: not item[0].startswith("resnet"))
    for row_id, meta in ordered:
        row = results["summary"].get(row_id, {})
        if "ember" not in row:
            continue
        unit = meta["unit"]

        def cell(side):
            return fmt(row[side]["median"], unit) if side in row else "—"

        def ratio(side):
            r = row.get(f"ember_speed_over_{side}")
            if not r:
                return "—"
            spread = f" ({r['min']:.2f}–{r['max']:.2f})" if r["min"] != r["max"] else ""
            return f"{r['median']:.2f}{spread}"

        comp = row.get("torch_compile", {})
        compile_cell = "—"
        if "compile_s_cold" in comp or "compile_s_warm" in comp:
            compile_cell = " / ".join(f"{comp[k]:.1f}" if k in comp else "—"
                                      for k in ("compile_s_cold", "compile_s_warm"))
        rss = [row[s].get("peak_rss_mb") for s in ("ember", "torch_eager", "torch_compile") if s in row]
        rss_cell = " / ".join(f"{r:.0f}" for r in rss if r is not None) or "—"
        legacy = cell("torch_legacy")
        if "torch_legacy" in row:
            legacy += f" (ember {ratio('torch_legacy')})"
        lines.append(f"| {meta['title']} | {cell('ember')} | {cell('torch_eager')} | {cell('torch_compile')} "
                     f"| {ratio('torch_eager')} | {ratio('torch_compile')} | {compile_cell} | {rss_cell} "
                     f"| {legacy} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", help="PyTorch 2.x's Python (scripts/torch_ref.sh's venv)")
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a few steps each: proves the pipeline, not a measure")
    parser.add_argument("--only", help="comma-separated bench ids (resnet20_fp32, gpt, attention, ...)")
    parser.add_argument("--out", help="the results file (default: bench/results/torch2-cpu-DATE-COMMIT.json)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds one side may run")
    parser.add_argument("--deadline-min", type=float, default=17,
                        help="start no bench that (timed by its previous run) would end after this many "
                             "minutes; the file says where it stopped (0: no deadline)")
    parser.add_argument("--table", metavar="FILE", help="print the markdown table of a results file and stop")
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(json.load(f)))
        return 0
    if not args.python:
        parser.error("--python is needed (or --table)")

    selected = benches(args.quick)
    if args.only:
        wanted = set(args.only.split(","))
        selected = [b for b in selected if b.id in wanted]
    commit = output(["git", "-C", REPO, "rev-parse", "HEAD"])
    if output(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"]):
        commit += "-dirty"
    start = datetime.datetime.now(datetime.timezone.utc)
    new, old = torch_version(args.python), torch_version(LEGACY_PYTHON)
    results = {
        "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
        "commit": commit, "date": start.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
        "versions": {"torch": new[0], "torch_legacy": old[0],
                     "torchvision": output([args.python, "-c", "import torchvision; print(torchvision.__version__)"])},
        # What `import torch` alone holds (PyPI's CUDA build maps its CUDA libraries).
        "import_rss_mb": {"torch": new[1], "torch_legacy": old[1]},
        "python": args.python, "quick": args.quick, "load": [load()],
        "rows": {row_id: meta for b in selected for row_id, meta in b.rows.items()},
        "commands": {b.id: b.commands for b in selected}, "runs": [],
    }
    out = args.out or os.path.join(HERE, "results",
                                   f"torch2-cpu-{start.strftime('%Y%m%dT%H%M')}-{commit[:9]}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    # One inductor cache for the whole comparison, empty at the start: run 1 compiles cold.
    cache = tempfile.mkdtemp(prefix="ember-torch2-inductor-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    deadline = time.perf_counter() + 60 * args.deadline_min if args.deadline_min > 0 else None
    for run in range(args.runs):
        record = {"run": run + 1, "rows": {}, "lines": {}, "seconds": {}, "cpu_seconds": {}, "errors": {},
                  "load": {}}
        for b in selected:
            # A bench that would end after the deadline (timed by its previous run; in run 1,
            # one that would start after it) is not started: the comparison stops there, with
            # the runs it has.
            if deadline is not None:
                last = sum(v for k, v in results["runs"][run - 1]["seconds"].items()
                           if k.startswith(b.id + "/")) if run > 0 else 0.0
                if time.perf_counter() + last > deadline:
                    results["stopped"] = f"--deadline-min {args.deadline_min}: run {run + 1} stopped before {b.id}"
                    break
            if not record["seconds"]:
                results["runs"].append(record)
            for side, argv in b.commands.items():
                key = f"{b.id}/{side}"
                argv = [a.replace("{py}", args.python).replace("{build}", args.build) for a in argv]
                record["load"][key] = load()
                lines, seconds, cpu, error = run_side(argv, env, args.timeout)
                record["seconds"][key] = round(seconds, 1)
                record["cpu_seconds"][key] = round(cpu, 1)
                print(f"run {run + 1}/{args.runs} {key}: {seconds:.1f} s"
                      + (f", FAILED: {error}" if error else ""), file=sys.stderr, flush=True)
                if error:
                    record["errors"][key] = error
                    continue
                record["lines"][key] = lines
                try:
                    for row_id, sides in b.extract(side, lines).items():
                        record["rows"].setdefault(row_id, {}).update(sides)
                except (KeyError, IndexError) as e:
                    record["errors"][key] = f"unexpected JSON: missing {e}"
            results["summary"] = summarize(results)
            with open(out, "w") as f:  # after every bench: a cut-short comparison keeps what it did
                json.dump(results, f, indent=1)
        results["load"].append(load())
        if "stopped" in results:
            print(results["stopped"], file=sys.stderr)
            break
    shutil.rmtree(cache, ignore_errors=True)
    results["seconds"] = round((datetime.datetime.now(datetime.timezone.utc) - start).total_seconds(), 1)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))
    print(f"\nwritten: {os.path.relpath(out, REPO)} ({results['seconds']:.0f} s)", file=sys.stderr)
    failed = sum(len(r["errors"]) for r in results["runs"])
    if failed:
        print(f"{failed} side(s) failed: see \"errors\" in the file", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
