"""A real headless Chromium and a ``dpro dashboard`` process, for dpro's own tests and benchmarks.

Debian's ``chromium`` and ``chromium-driver`` (``make setup`` installs them); Selenium is told
the driver's path and sends no statistics, so nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dpro.errors import DproError

__all__ = ["free_port", "headless_chromium", "start_dashboard"]

DASHBOARD_READY = "dpro dashboard: http://"  # the line dpro dashboard prints once it is about to listen


def headless_chromium(downloads: Path | None = None) -> Any:
    """A Selenium driver of headless Chromium that keeps the console's messages (and saves
    downloads in ``downloads``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_AVOID_STATS"] = "true"  # Selenium Manager: no statistics, no driver download
    chromedriver = shutil.which("chromedriver")
    if chromedriver is None:
        raise DproError("no chromedriver on PATH: install chromium and chromium-driver (make setup does, as root)")
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if downloads is not None:
        options.add_experimental_option("prefs", {"download.default_directory": str(downloads)})
    return webdriver.Chrome(service=Service(chromedriver), options=options)


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dashboard(*args: str, timeout_s: float = 300) -> tuple[subprocess.Popen, str]:
    """``dpro dashboard ARGS --port P`` on a free port, once it accepts connections: the
    process (stderr piped) and its URL."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "dpro", "dashboard", *args, "--port", str(port)],
                              stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        if line.startswith(DASHBOARD_READY):
            break
    else:
        raise DproError(f"dpro dashboard exited with {server.wait()} before listening")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"http://127.0.0.1:{port}"
        time.sleep(0.05)
    server.terminate()
    raise DproError(f"dpro dashboard never listened on port {port}")
