"""The dashboard at fleet scale: time to first byte, rendered pages in headless Chromium, sizes, memory.

    python bench/dashboard.py [--nodes 4000] [--replicas 10000] [--keep DIR] [--screenshots DIR]

Generates bench/placement.py's fleet and catalog, writes its status/ with
`reconciler plan --inventory status/nodes.yaml --write-status` (as the browser tests do),
serves it with `python -m reconciler dashboard` on loopback, and prints per page: the time
to the first byte of the answer (the first request after start, and the best of five after),
the size of the page, and for the HTML pages the time headless Chromium (Debian's, through
Selenium) takes to a loaded page; then the server's resident memory.

Targets (issue 22): the overview under 1 s; the fleet page usable with a filter (it renders a
page of 100 nodes with a count of all, server-side).

--screenshots DIR: PNGs of the overview, models and fleet pages of the bundled ten-node catalog
(planned offline, with some GPUs in the health states of SPEC section 9), for the README.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.test_dashboard_browser import Dashboard, big_tree, chromium  # noqa: E402

PAGES = ["/", "/models", "/fleet", "/fleet?label=zone%3Da", "/fleet?model=m000", "/models?model=zz-huge",
         "/replicas/zz-huge-0", "/api/version", "/api/status", "/api/nodes"]


def cpu_s(pid: int) -> float:
    """CPU seconds the process has used (user + system): on a shared machine wall time also
    counts what the others run."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def first_byte(port: int, target: str) -> tuple[float, float, int]:
    """(seconds to the first byte, seconds to the last, bytes) of GET target."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    conn.request("GET", target)
    answer = conn.getresponse()
    ttfb = time.perf_counter() - t0
    body = answer.read()
    total = time.perf_counter() - t0
    conn.close()
    assert answer.status == 200, (target, answer.status)
    return ttfb, total, len(body)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench(root: Path) -> None:
    dash = Dashboard(root)
    try:
        print(f"{'page':28} {'first ttfb':>10} {'ttfb best':>10} {'full best':>10} {'server CPU':>10} {'size':>10}")
        for target in PAGES:
            cold, _, _ = first_byte(dash.port, target)
            before = cpu_s(dash.proc.pid)
            runs = [first_byte(dash.port, target) for _ in range(5)]
            cpu = (cpu_s(dash.proc.pid) - before) / 5
            ttfb = min(r[0] for r in runs)
            full = min(r[1] for r in runs)
            size = runs[0][2]
            print(f"{target:28} {cold:9.3f}s {ttfb:9.3f}s {full:9.3f}s {cpu:9.3f}s {size / 1024:8.0f} KiB")
        driver = chromium()
        try:
            print(f"\n{'page in headless Chromium':28} {'loaded':>10} {'best of 3':>10}")
            for target in ["/", "/models", "/fleet", "/fleet?label=zone%3Da", "/fleet?per=1000"]:
                times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    driver.get(dash.url + target)  # returns at the load event
                    times.append(time.perf_counter() - t0)
                print(f"{target:28} {times[0]:9.3f}s {min(times):9.3f}s")
        finally:
            driver.quit()
        print(f"\nserver RSS: {rss_mib(dash.proc.pid):.0f} MiB")
        after_a_pass(root, dash)
    finally:
        dash.stop()


def rewrite(path: Path, old: str, new: str) -> None:
    """As the status writer does: a new file renamed into place."""
    text = path.read_text()
    assert old in text, (path, old)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text.replace(old, new, 1))
    tmp.rename(path)


def after_a_pass(root: Path, dash: Dashboard) -> None:
    """A pass rewrote nodes.yaml: the next overview's first byte, and how long the change takes to
    show on an open fleet page in Chromium (no reload), three times."""
    from selenium.webdriver.common.by import By

    nodes = root / "status" / "nodes.yaml"
    token = f"bench-{os.getpid()}"
    first = yaml_reason(nodes)
    rewrite(nodes, f"reason: {first}", f"reason: {token}-0")
    ttfb, _, _ = first_byte(dash.port, "/")
    print(f"\noverview right after a pass rewrote nodes.yaml ({nodes.stat().st_size >> 20} MiB): first byte {ttfb:.3f}s")
    time.sleep(2)
    driver = chromium()
    try:
        driver.get(dash.url + "/fleet?state=unreachable&per=10")
        times = []
        for n in range(1, 4):
            content = driver.find_element(By.ID, "content")
            assert f"{token}-{n - 1}" in content.text and f"{token}-{n}" not in content.text
            # The page notes when its content changes (its clock is this machine's): polling the
            # page through WebDriver would add WebDriver's own round trips to the figure.
            driver.execute_script("window.__changed = null; new MutationObserver(function () {"
                                  " if (!window.__changed) window.__changed = Date.now(); })"
                                  ".observe(document.getElementById('content'), {childList: true, subtree: true});")
            written = time.time()
            rewrite(nodes, f"reason: {token}-{n - 1}", f"reason: {token}-{n}")
            deadline = time.monotonic() + 30
            while not (changed := driver.execute_script("return window.__changed")) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert f"{token}-{n}" in driver.find_element(By.ID, "content").text
            times.append(changed / 1000 - written)
            time.sleep(1)
        print("a change to nodes.yaml on an open fleet page, without a reload: "
              + ", ".join(f"{t:.2f}s" for t in times))
    finally:
        driver.quit()


def yaml_reason(nodes: Path) -> str:
    """The reason of the first unreachable node in nodes.yaml, as written."""
    lines = nodes.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "state: unreachable":
            return lines[i + 1].split("reason:", 1)[1].strip()
    raise AssertionError("no unreachable node in the generated fleet")


def screenshots(out: Path) -> None:
    from tests.test_dashboard import add_gpu_health, planned_catalog

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = planned_catalog(Path(tmp))
        add_gpu_health(root)
        dash = Dashboard(root)
        driver = chromium()
        try:
            for name, target in (("overview", "/"), ("models", "/models"), ("fleet", "/fleet")):
                driver.set_window_size(1400, 900)
                driver.get(dash.url + target)
                time.sleep(1.5)  # the age line is filled in by the page's script
                height = driver.execute_script("return document.documentElement.scrollHeight")
                driver.set_window_size(1400, min(max(height + 40, 600), 2400))
                time.sleep(0.3)
                driver.save_screenshot(str(out / f"dashboard-{name}.png"))
                print(f"wrote {out / f'dashboard-{name}.png'}")
        finally:
            driver.quit()
            dash.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4000)
    ap.add_argument("--replicas", type=int, default=10000)
    ap.add_argument("--keep", metavar="DIR", help="write the generated catalog here and keep it (reused when there)")
    ap.add_argument("--screenshots", metavar="DIR", help="only write the README's screenshots into DIR")
    args = ap.parse_args()
    if args.screenshots:
        screenshots(Path(args.screenshots))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp) / "catalog"
        if (root / "status" / "models").is_dir():
            print(f"reusing {root} (--keep): its status/ as the last run wrote it\n")
        else:
            t0 = time.perf_counter()
            big_tree(root, args.nodes, args.replicas)
            print(f"{args.nodes} nodes, {args.replicas} replicas: status/ written by plan --write-status "
                  f"in {time.perf_counter() - t0:.1f} s\n")
        bench(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
