"""Screenshots of every console page on the demo's database, for docs/operators.md.

    python docs/tools/screenshots.py [--out docs/img] [--chromium /usr/bin/chromium]

Runs ``synckit demo`` in a temporary directory (it keeps its key in synckit-demo.key),
serves ``synckit web --app synckit.examples.graph_mail.app:app`` on that database with
that key, and photographs each page with Playwright driving Chromium (nothing is
downloaded: give the browser's path). Needs the ``web`` extra and ``playwright``.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = "synckit.examples.graph_mail.app:app"
SYNCKIT = [sys.executable, "-m", "synckit.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument(
        "--chromium", default=os.environ.get("SYNCKIT_CHROMIUM", "/usr/bin/chromium")
    )
    args = parser.parse_args()
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCKIT_")}
        subprocess.run([*SYNCKIT, "demo"], cwd=work, env=env, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        env["SYNCKIT_SECRET_KEY"] = (work / "synckit-demo.key").read_text().strip()
        port = free_port()
        web = subprocess.Popen(
            [*SYNCKIT, "web", "--app", APP, "--database-url", "sqlite:///synckit-demo.db",
             "--port", str(port)],
            cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline or web.poll() is not None:
                        raise SystemExit("synckit web did not start") from None
                    time.sleep(0.2)
            base = f"http://127.0.0.1:{port}"
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 860})

                def shoot(name: str, path: str) -> None:
                    response = page.goto(base + path)
                    if response is None or response.status != 200:
                        raise SystemExit(f"{path}: {response.status if response else 'no answer'}")
                    target = args.out / f"demo-{name}.png"
                    page.screenshot(path=str(target), full_page=True)
                    print(target.relative_to(ROOT) if target.is_relative_to(ROOT) else target)

                def first(path: str, pattern: str) -> str | None:
                    page.goto(base + path)
                    found = re.search(pattern, page.content())
                    return found.group(1) if found else None

                shoot("overview", "/")
                shoot("tenants", "/tenants")
                for name in ("contoso", "fabrikam", "northwind"):
                    shoot(f"tenant-{name}", f"/tenants/{name}")
                shoot("jobs", "/jobs")
                if job := first("/jobs", r'href="/jobs/(\d+)"'):
                    shoot("job", f"/jobs/{job}")
                shoot("dead-letters", "/dlq")
                if letter := first("/dlq", r'href="/dlq/(\d+)"'):
                    shoot("dead-letter", f"/dlq/{letter}")
                shoot("outbox", "/outbox")
                shoot("workers", "/workers")
                shoot("webhook-events", "/webhook-events")
                browser.close()
        finally:
            web.terminate()
            web.wait(20)


if __name__ == "__main__":
    main()
