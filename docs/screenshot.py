"""Take the screenshot of `edgemem chat` kept in docs/ (a development step, not part of the app).

    python docs/screenshot.py                 # -> docs/chat.svg (real SmolLM2, 80x24)
    rsvg-convert -z 2 docs/chat.svg -o docs/chat.png   # apt-get install librsvg2-bin

It ingests Python's own `json` package with the real model, asks one question, waits for the
streamed answer and saves what the terminal shows. EDGEMEM_HOME defaults to
/tmp/edgemem-screenshot so the user's library is not touched (the first run dequantises the
model, about 45 s). The memory is untrained until an adapter ships, so the answer is about the
last segment of the folder, the end of json/tool.py: the question asks about that.
"""

from __future__ import annotations

import asyncio
import os
import sys
import sysconfig
from pathlib import Path

os.environ.setdefault("EDGEMEM_HOME", "/tmp/edgemem-screenshot")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from edgemem.tui.app import EdgememApp  # noqa: E402
from edgemem.tui.config import Settings, save_settings  # noqa: E402

DOCS = Path(__file__).parent
FOLDER = Path(sysconfig.get_paths()["stdlib"]) / "json"
QUESTION = "Which command-line options does the tool accept?"  # json/tool.py ends the folder


async def main(size: tuple[int, int]) -> None:
    config = Path(os.environ["EDGEMEM_HOME"]) / "screenshot.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    save_settings(Settings(max_new_tokens=60), config)
    app = EdgememApp([FOLDER], settings_file=config)
    async with app.run_test(size=size) as pilot:
        while app.model_status != "ready" or app.status_of(FOLDER) != "ready":
            await pilot.pause(0.2)
        if not app.query(".msg"):
            await pilot.click("#question")
            await pilot.press(*QUESTION, "enter")
            while app.generating or not app.last_answer:
                await pilot.pause(0.2)
        await pilot.pause(1.0)  # let the notifications time out
        app.clear_notifications()
        await pilot.pause(0.2)
        app.save_screenshot(filename="chat.svg", path=str(DOCS))
    print(f"saved {DOCS / 'chat.svg'}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main((80, 24)))
