"""Retakes docs/img/mlflow-ui.png: MLflow's UI on a study recorded with ``--track``.

Runs a four-trial ``tune`` of fashion_mnist_mlp with ``--track`` into a fresh
SQLite store, serves it with ``mlflow ui`` on 127.0.0.1, and takes the picture
of the study's runs page, its trials unfolded, in the chart view, in Debian's
headless Chromium (``apt-get install chromium``) driven by Playwright
(``pip install playwright``: its driver only; it uses that Chromium). From the
checkout, with the tune and mlflow extras::

    python docs/_screenshots/mlflow_ui.py --data-dir data

Everything it starts is ended by its PID; its files go to a temporary folder.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "docs", "img", "mlflow-ui.png")
SPACE = "learning_rate: {type: double, min: 0.0003, max: 0.01, scale: log}\n"
# Chromium with no network of its own (Playwright adds --headless).
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    return dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))


def record_study(folder, data_dir, store):
    """The study whose runs the picture shows."""
    space = os.path.join(folder, "space.yaml")
    with open(space, "w", encoding="utf-8") as f:
        f.write(SPACE)
    command = [sys.executable, "-m", "experiments", "tune", "fashion_mnist_mlp", "--space", space,
               "--trials", "4", "--parallel", "2", "--seed", "1", "--model-dir",
               os.path.join(folder, "runs", "tune-mlp"), "--max-steps", "300", "--eval-every",
               "100", "--data-dir", data_dir, "--track", store, "--no-plots"]
    print("recording:", " ".join(command), flush=True)
    subprocess.run(command, cwd=folder, env=_env(), check=True, timeout=1800)


def serve(store, folder):
    """``mlflow ui`` on the store: (process, URL)."""
    port = _free_port()
    log = open(os.path.join(folder, "ui.log"), "wb")  # pylint: disable=consider-using-with
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store,
                             "--host", "127.0.0.1", "--port", str(port)], cwd=folder,
                            env=_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    stop(proc)
    raise SystemExit(f"mlflow ui did not start; see {folder}/ui.log")


def stop(proc):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=15)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def page_url(url, store):
    """The study's experiment page: its runs."""
    # pylint: disable-next=import-outside-toplevel
    from mlflow import MlflowClient
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("fashion_mnist_mlp")
    return f"{url}/#/experiments/{experiment.experiment_id}/runs"


def screenshot(chromium, url, out, size):
    """The study's runs unfolded, in the runs page's chart view, MLflow's
    assistant panel closed: clicks a person makes, made by Playwright in
    Debian's Chromium (no browser of Playwright's own is downloaded)."""
    # pylint: disable-next=import-outside-toplevel  (a tool of this script only)
    from playwright.sync_api import sync_playwright
    width, height = (int(n) for n in size.split(","))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium,
                                             args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url)
            page.get_by_text("tune-fashion_mnist_mlp").first.wait_for(timeout=60000)
            close = page.get_by_role("button", name="Close")
            if close.count():
                close.first.click()
            # The study's run, unfolded to its trials.
            page.locator("button[data-component-id$='runnamecellrenderer.tsx_46']").first.click()
            page.get_by_text("trial-0").first.wait_for(timeout=30000)
            # The view switch: list, chart, evaluation.
            page.locator("[role=radiogroup][data-component-type=segmented_control_group] "
                         "label").nth(1).click()
            page.get_by_text("eval_accuracy").first.wait_for(timeout=30000)
            page.wait_for_timeout(3000)  # the charts' drawing
            page.screenshot(path=out)
        finally:
            browser.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "data"),
                        help="where fashion_mnist is prepared (prepared there when missing)")
    parser.add_argument("--out", default=OUT, help=f"the picture (default {OUT})")
    parser.add_argument("--size", default="1600,1000", help="the browser window, W,H")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="mlflow-ui-shot-")
    store = f"sqlite:///{folder}/mlflow.db"
    record_study(folder, os.path.abspath(args.data_dir), store)
    proc, url = serve(store, folder)
    try:
        target = page_url(url, store)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        staged = args.out + ".tmp.png"
        screenshot(args.chromium, target, staged, args.size)
        os.replace(staged, args.out)
        print(f"{args.out}: {target}")
    finally:
        stop(proc)
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
