"""The dashboard in a real browser: Debian's Chromium, headless, driven by Selenium through chromedriver.

On status trees the project writes itself: (a) `reconciler apply` of the single-machine example
(a real tiny server through the local transport, stopped after by its process group), and (b) a
4,000-node, 10,000-replica `plan --write-status` of bench/placement.py's generated fleet. The
dashboard runs as `python -m reconciler dashboard`, a real server on loopback.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.apply_support.local import example_catalog, free_port, kill_recorded, stop_group, wait_for
from tests.conftest import REPO, run_cli

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SECRET_VALUE = "s3cret-value-from-env-7731"

pytestmark = pytest.mark.external


def chromium():
    """A headless Chromium through chromedriver, both Debian's (never a downloaded browser)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip("chromium and chromium-driver are not installed (scripts/test.sh installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


class Dashboard:
    """`python -m reconciler dashboard CATALOG --address 127.0.0.1:PORT` as a child process."""

    def __init__(self, catalog: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "reconciler", "dashboard", str(catalog), "--address",
                                      f"127.0.0.1:{self.port}"], env=env, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the dashboard exited: {self.proc.stderr.read().decode()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError("the dashboard never listened")

    def raw(self, target: str) -> tuple[int, bytes]:
        """One request with the target exactly as given: a browser would normalise `..` away."""
        return self.raw_host(target, f"127.0.0.1:{self.port}")

    def raw_host(self, target: str, host: str) -> tuple[int, bytes]:
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), body

    def stop(self) -> None:
        stop_group(self.proc, timeout=10)


def resources_same_origin(driver, origin: str) -> list[str]:
    """Every resource the page loaded (scripts, styles, fetches), and any that came from elsewhere."""
    names = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert any(n.endswith("/static/dashboard.js") for n in names) and any(n.endswith("/static/dashboard.css") for n in names)
    return [n for n in names if not n.startswith(origin + "/")]


def csp_violations(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]


# ------------------------------------------------------------------ (a) a real apply of the example


@pytest.fixture
def applied_example(tmp_path):
    root = example_catalog(tmp_path)
    model_file = root / "models" / "tiny-echo.yaml"
    model = yaml.safe_load(model_file.read_text())
    model["profiles"][0]["env"]["API_KEY"] = {"from_env": "DASHBOARD_SECRET"}  # a reference, never its value
    model_file.write_text(yaml.safe_dump(model, sort_keys=False))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run(git + ["init", "-q"], cwd=root, check=True, timeout=60)
    subprocess.run(git + ["add", "-A"], cwd=root, check=True, timeout=60)
    subprocess.run(git + ["commit", "-qm", "catalog"], cwd=root, check=True, timeout=60)
    try:
        done = run_cli("apply", str(root), env={"XDG_STATE_HOME": str(tmp_path / "xdg"), "DASHBOARD_SECRET": SECRET_VALUE})
        assert done.returncode == 0, done.stderr
        yield root
    finally:
        kill_recorded(tmp_path / "state")


def test_the_example_fleet_in_chromium(applied_example):
    root = applied_example
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    status = yaml.safe_load((root / "status" / "models" / "tiny-echo.yaml").read_text())
    replica = status["replicas"][0]
    dash = Dashboard(root)
    driver = chromium()
    try:
        from selenium.webdriver.common.by import By

        driver.get(dash.url + "/")
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "Synced" in body and head in body
        assert driver.find_element(By.ID, "ready-count").text == "1"
        assert driver.find_element(By.ID, "desired-count").text == "1"
        wait_for(lambda: "ago" in driver.find_element(By.ID, "age").text, what="the data's age")
        assert resources_same_origin(driver, dash.url) == []

        driver.get(dash.url + "/models")
        row = driver.find_element(By.CSS_SELECTOR, "tr.replica")
        assert replica["id"] in row.text and "Ready" in row.text and replica["nodes"][0]["endpoint"] in row.text
        assert replica["nodes"][0]["endpoint"] in driver.find_element(By.CSS_SELECTOR, ".endpoints").text

        # A change to the files shows without a reload: the page's own script fetches it.
        driver.execute_script("window.__sameDocument = 'yes'")
        path = root / "status" / "models" / "tiny-echo.yaml"
        changed = dict(status, ready=0)
        changed["replicas"] = [dict(replica, phase="Failed", message="dashboard test: it died", failure="temporary")]
        from reconciler.record.status.files import dump_yaml

        path.write_text(dump_yaml(changed))
        wait_for(lambda: "dashboard test: it died" in driver.find_element(By.ID, "content").text,
                   timeout=8, what="the changed file on the page")
        assert driver.execute_script("return window.__sameDocument") == "yes"
        assert "Failed" in driver.find_element(By.CSS_SELECTOR, "tr.replica").text

        # Nothing can be submitted; every resource is this server's; the CSP held.
        for page in ("/", "/models", "/fleet", f"/replicas/{replica['id']}"):
            driver.get(dash.url + page)
            assert driver.find_elements(By.CSS_SELECTOR, "form, button, input, select, textarea") == []
            assert resources_same_origin(driver, dash.url) == []
            assert SECRET_VALUE not in driver.page_source
        assert csp_violations(driver) == []
        driver.get(dash.url + "/fleet")
        assert driver.find_element(By.ID, "node-local").text.startswith("local")
        assert "demo" in driver.find_element(By.CSS_SELECTOR, "#node-local .labels").text

        # Path traversal, as raw requests (the browser would normalise them away).
        for target in ("/static/../../../../etc/passwd", "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
                       "/static/..%2f..%2fapp.py", "/../fleet.yaml", "/status/../fleet.yaml"):
            code, body = dash.raw(target)
            assert code in (400, 404), target
            assert b"root:" not in body and b"transport" not in body
        assert dash.raw("/api/status")[0] == 200
        assert dash.raw_host("/api/status", "rebound.example")[0] == 421
    finally:
        driver.quit()
        dash.stop()


# ------------------------------------------------------------------ (b) 4,000 nodes, 10,000 replicas


def big_tree(root: Path, nodes: int = 4000, replicas: int = 10000) -> Path:
    """bench/placement.py's generated fleet, planned with `plan --inventory status/nodes.yaml --write-status`
    (the pull-request check's command)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import placement
    finally:
        sys.path.remove(str(REPO / "bench"))
    import random

    fleet_doc, models, snapshot = placement.generate(nodes, replicas)
    # A few GPUs in the states of SPEC section 9, as a probe with the health checks reports them.
    rnd = random.Random(3)
    gpu_nodes = [n for n in snapshot["nodes"] if n["gpus"]]
    for n in rnd.sample(gpu_nodes, 40):
        n["gpus"][7].update(health="unhealthy", health_reason="2 uncorrected ECC errors")
    (root / "models").mkdir(parents=True)
    (root / "fleet.yaml").write_text(yaml.safe_dump(fleet_doc, sort_keys=False))
    for name, doc in models.items():
        (root / "models" / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    (root / "status").mkdir()
    from reconciler.record.status.files import dump_yaml

    (root / "status" / "nodes.yaml").write_text(dump_yaml(snapshot))
    done = run_cli("plan", str(root), "--inventory", str(root / "status" / "nodes.yaml"), "--write-status",
                   timeout=600)
    assert done.returncode == 0, done.stderr
    return root


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return big_tree(tmp_path_factory.mktemp("big") / "catalog")


def test_four_thousand_nodes_in_chromium(big):
    from selenium.webdriver.common.by import By

    snapshot = yaml.load((big / "status" / "nodes.yaml").read_bytes(), Loader=yaml.CSafeLoader)
    zone_a = [n["id"] for n in snapshot["nodes"] if n["labels"].get("zone") == "a"]
    dash = Dashboard(big)
    driver = chromium()
    try:
        driver.get(dash.url + "/")
        desired = sum(yaml.load(p.read_bytes(), Loader=yaml.CSafeLoader)["desired"]
                      for p in (big / "status" / "models").glob("*.yaml"))
        assert driver.find_element(By.ID, "desired-count").text == str(desired)
        assert driver.find_element(By.ID, "gpus-unhealthy").text == "40"
        assert "4000" in driver.find_element(By.ID, "nodes-card").text

        driver.get(dash.url + "/fleet")
        rows = driver.find_elements(By.CSS_SELECTOR, "tr.node")
        assert len(rows) == 100  # a page of the fleet, with the count of all
        assert "of 4000" in driver.find_element(By.ID, "fleet-count").text
        driver.get(dash.url + "/fleet?label=zone%3Da&per=1000")
        shown = [r.get_attribute("data-node") for r in driver.find_elements(By.CSS_SELECTOR, "tr.node")]
        assert shown == zone_a[:1000] and f"of {len(zone_a)} matching" in driver.find_element(By.ID, "fleet-count").text
        driver.get(dash.url + "/fleet?gpu=unhealthy")
        assert len(driver.find_elements(By.CSS_SELECTOR, "tr.node")) == 40
        assert len(driver.find_elements(By.CSS_SELECTOR, ".gpu.use-unhealthy")) == 40
        assert "2 uncorrected ECC errors" in driver.find_element(By.CSS_SELECTOR, ".gpu.use-unhealthy").text

        # A model's replicas, and one that fits nowhere with its rejections grouped, nodes named.
        driver.get(dash.url + "/models?model=zz-huge")
        unplaced = driver.find_element(By.ID, "unplaced-zz-huge-0")
        assert "cannot be placed" in unplaced.text and "19 more replicas of zz-huge" in unplaced.text
        assert len(unplaced.find_elements(By.CSS_SELECTOR, "tr.rejection")) >= 2
        assert unplaced.find_elements(By.CSS_SELECTOR, "a[href^='/fleet?node=']")
        driver.get(dash.url + "/fleet?model=m000")
        held = driver.find_elements(By.CSS_SELECTOR, ".gpu.use-held")
        assert held and any(h.text.split()[1].startswith("m000-") for h in held)
        assert held[0].get_attribute("title").startswith("GPU ")
        assert resources_same_origin(driver, dash.url) == []
        assert csp_violations(driver) == []
    finally:
        driver.quit()
        dash.stop()
