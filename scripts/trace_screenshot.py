#!/usr/bin/env python3
"""Opens a Chrome Trace Event JSON (ember-train --trace) in the Catapult trace viewer, the UI
of chrome://tracing, in headless Chromium, and saves a PNG of it. scripts/trace_screenshot.sh
makes the venv it runs in and the trace; see there.

  trace_screenshot.py TRACE OUT.png --viewer CATAPULT_HTML [--width W] [--height H]
                      [--select NAME] [--select-pid PID] [--chromium PATH]

--viewer is catapult_trace_viewer.html, the about:tracing page (Record / Save / Load) that
Perfetto's UI ships for "Open with legacy UI"; the trace goes in as that button hands it over,
through the page's setActiveTrace. --select NAME selects the last event of that name in
process PID (a rank), so the panel under the timeline shows its fields and args. It prints
the processes and rows the viewer built, its import warnings and the event it selected.

Chromium is driven over its DevTools protocol (websocket-client); it runs headless, with a
throwaway profile, and is closed at the end.
"""
import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket


class DevTools:
    """One page of a Chromium started with --remote-debugging-port=0."""

    def __init__(self, profile, proc, timeout_s):
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.time() + timeout_s
        while not os.path.exists(port_file):
            if proc.poll() is not None or time.time() > deadline:
                sys.exit(f"trace_screenshot: Chromium did not open its DevTools port "
                         f"(exit status {proc.poll()})")
            time.sleep(0.2)
        time.sleep(0.2)  # the file is written, then filled
        with open(port_file) as f:
            port = int(f.readline())
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout_s,
                                              suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    sys.exit(f"trace_screenshot: {method}: {reply['error']}")
                return reply["result"]

    def eval(self, expression):
        """The value of a JavaScript expression (awaited when it is a promise)."""
        r = self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                      returnByValue=True)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            sys.exit("trace_screenshot: in the page: " +
                     d.get("exception", {}).get("description", d.get("text", "")))
        return r["result"].get("value")

    def wait_for(self, expression, what, timeout_s):
        deadline = time.time() + timeout_s
        while not self.eval(expression):
            if time.time() > deadline:
                sys.exit(f"trace_screenshot: {what} did not happen in {timeout_s} s")
            time.sleep(0.25)


# Lists the viewer's processes and rows, and selects --select's event: run in the page once the
# model is loaded.
INSPECT_JS = """(() => {
  const tv = profilingView.timelineView;
  const m = tv.model;
  const out = {processes: [], warnings: m.importWarnings.map(w => w.message), selected: null};
  for (const p of Object.values(m.processes)) {
    const rows = Object.values(p.threads).map(t => `${t.name} (${t.sliceGroup.length} events)`);
    out.processes.push(`${p.userFriendlyName}: ${rows.join(', ')}`);
  }
  const name = %(name)s, pid = %(pid)d;
  if (name && m.processes[pid]) {
    let last;
    for (const t of Object.values(m.processes[pid].threads))
      for (const s of t.sliceGroup.slices)
        if (s.title === name && (!last || s.start > last.start)) last = s;
    if (last) {
      tv.brushingStateController.changeSelectionFromTimeline(new tr.model.EventSet([last]));
      out.selected = `${last.title} at ${last.start.toFixed(3)} ms for ${last.duration.toFixed(3)} ms, args ${JSON.stringify(last.args)}`;
    }
  }
  return out;
})()"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--viewer", required=True, help="catapult_trace_viewer.html")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=700)
    ap.add_argument("--analysis-height", type=int, default=220,
                    help="pixels of the selection panel under the timeline")
    ap.add_argument("--select", default="", help="name of the event to select")
    ap.add_argument("--select-pid", type=int, default=0)
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    ap.add_argument("--timeout", type=float, default=120, help="seconds for each wait")
    a = ap.parse_args()

    with open(a.trace, encoding="utf-8") as f:
        trace_text = f.read()
    json.loads(trace_text)  # fail here, not in the page, when the file is not JSON

    profile = tempfile.mkdtemp(prefix="ember-trace-shot-")
    args = [a.chromium, "--headless=new", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={profile}",
            f"--window-size={a.width},{a.height}", "about:blank"]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium's sandbox refuses to run as root
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        dt = DevTools(profile, proc, a.timeout)
        dt.call("Emulation.setDeviceMetricsOverride", width=a.width, height=a.height,
                deviceScaleFactor=1, mobile=False)
        dt.call("Page.navigate", url="file://" + os.path.abspath(a.viewer))
        dt.wait_for("!!(window.profilingView && profilingView.timelineView)",
                    "the viewer's start", a.timeout)
        dt.eval("profilingView.setActiveTrace(%s, %s), true" %
                (json.dumps(os.path.basename(a.trace)), json.dumps(trace_text)))
        dt.wait_for("!!(profilingView.timelineView.model && "
                    "Object.keys(profilingView.timelineView.model.processes).length)",
                    "the trace's import", a.timeout)
        # The banner about the Web Components polyfill the page runs on says nothing of the
        # trace: hide it, as its Hide button does.
        dt.eval("profilingView.timelineView.$['polyfill-warning'].style.display = 'none', true")
        dt.eval(f"profilingView.timelineView.$.analysis.style.height = '{a.analysis_height}px', true")
        info = dt.eval(INSPECT_JS % {"name": json.dumps(a.select), "pid": a.select_pid})
        # Two animation frames: the timeline has drawn what the calls above changed.
        dt.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))")
        time.sleep(1)
        png = base64.b64decode(dt.call("Page.captureScreenshot", format="png")["data"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)

    with open(a.out, "wb") as f:
        f.write(png)
    for p in info["processes"]:
        print("viewer:", p)
    print("viewer: import warnings:", "; ".join(info["warnings"]) or "none")
    if a.select:
        print("viewer: selected:", info["selected"] or f"no event named {a.select!r} in pid {a.select_pid}")
    print(f"trace_screenshot: {a.out} ({a.width}x{a.height}, {len(png)} bytes)")


if __name__ == "__main__":
    main()
