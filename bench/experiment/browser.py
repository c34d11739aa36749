"""Headless Chromium for the results page: the page's DOM after it loaded (the browser test) and a screenshot."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = "install it with `apt-get install -y chromium` (Debian/Ubuntu, as root)"


def chromium() -> str:
    """The headless browser's executable; raises FileNotFoundError saying how to install it."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(f"no chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}): {INSTALL_HINT}")


def run_chromium(page: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``file://<page>`` with ``args``, in a throw-away profile."""
    with tempfile.TemporaryDirectory(prefix="pflrepro-chromium-") as profile:
        command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   f"--user-data-dir={profile}", *args, page.resolve().as_uri()]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def screenshot(page: Path, out: Path | None = None, size: str = "1280,4000") -> Path:
    """A PNG of ``page`` (default: beside it, ``index.png``), written through a temp file and ``os.replace``."""
    out = out or page.with_suffix(".png")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".png", dir=out.parent)
    os.close(fd)
    try:
        done = run_chromium(page, f"--screenshot={tmp}", f"--window-size={size}", "--virtual-time-budget=5000")
        if done.returncode != 0 or not os.path.getsize(tmp):
            raise RuntimeError(f"chromium --screenshot failed ({done.returncode}): {done.stderr[-2000:]}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out
