"""A dataset for the viewer tests: what trajforge really makes, plus a web step with a screenshot.

- Agent-R output of `mcts_splice` on one retail task with the scripted model (real spliced
  trajectories, their source paths and preference pairs, no real model);
- hand-made tool trajectories (`tests.factories`), one labelled by a step judge and one with an
  outcome judge's verdict;
- a web trajectory whose screenshot is a PNG file in the dataset directory;
- quarantined inputs and filtered records, each with its reason.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from generators.base import TaskSpec
from generators.mcts_splice import MCTSSplice, MCTSSpliceConfig
from generators.scripted import ScriptedRetailLLM, cancel_tasks
from schemas.models import (
    ApiAction,
    FilterDecision,
    Filtered,
    ImageRef,
    MessageAction,
    Provenance,
    Quarantined,
    TextObservation,
    Trajectory,
    WebObservation,
)
from schemas.store import Dataset
from tests.factories import tool_trajectory

WEB_ID = "web/checkout-1"
SCREENSHOT = "screenshots/checkout-1.png"
JUDGED_ID = "test/7"
SEARCH_TEXT = "zebra-lamp"  # only in one trajectory's step (a tool argument)
SEARCH_ID = "test/3"
QUARANTINE_REASON = "ConversionError: `steps[2].arguments` is not a JSON object"


def spliced_output() -> tuple[list[Trajectory], list]:
    task = cancel_tasks(1)[0]
    # The closest-pair rule keeps the fixture small (the viewer is under test here, not the pairing).
    method = MCTSSplice(MCTSSpliceConfig(tasks={"n": 1}, pairing="closest", max_pairs_per_task=4), ScriptedRetailLLM([task]))

    async def run() -> Any:
        await method.setup()
        return await method.run_task(TaskSpec(id=task.id))

    result = asyncio.run(run())
    return result.trajectories, result.pairs


def screenshot_png(path: Path) -> None:
    from PIL import Image, ImageDraw

    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", (320, 180), (236, 242, 250))
    draw = ImageDraw.Draw(img)
    draw.rectangle((20, 20, 300, 60), fill=(36, 87, 197))
    draw.text((30, 32), "CHECKOUT  - order #1042", fill=(255, 255, 255))
    draw.rectangle((20, 110, 140, 150), fill=(31, 122, 68))
    draw.text((40, 122), "Pay now", fill=(255, 255, 255))
    img.save(path)


def web_trajectory() -> Trajectory:
    return Trajectory(
        id=WEB_ID, source="web-demo",
        steps=[
            TextObservation(content="Pay for order 1042.", source="user"),
            WebObservation(url="http://shop.local/checkout/1042", axtree='[1] button "Pay now"',
                           screenshot=ImageRef(path=SCREENSHOT), viewport=(320, 180)),
            ApiAction(function="click", arguments={"element": 1}, thought="The pay button is element 1."),
            WebObservation(url="http://shop.local/paid/1042", axtree='[1] heading "Thank you"'),
            MessageAction(content="Order 1042 is paid."),
        ],
        reward=1.0, success=True, provenance=Provenance(method="rollout", model="scripted"),
    )


def judged_trajectory() -> Trajectory:
    traj = tool_trajectory(7)
    traj.steps[1].label = "good"
    traj.steps[1].extra["judge_reason"] = "the search is the right first step"
    traj.steps[3].label = "bad"
    traj.steps[3].extra["judge_reason"] = "claims stock without checking the count"
    traj.details["judge"] = {"quality": {"score": 2, "reason": "answers without evidence", "model": "judge-x"}}
    return traj


def build(path: Path) -> Dataset:
    ds = Dataset.create(path, stage="test")
    trajectories, pairs = spliced_output()
    searchable = tool_trajectory(3)
    searchable.steps[1].arguments = {"query": SEARCH_TEXT}
    plain = [tool_trajectory(i, success=i % 2 == 0) for i in (0, 1, 2, 4, 5)]
    with ds.unit("u0") as unit:
        unit.write_many("trajectories", [*trajectories, searchable, *plain, judged_trajectory(), web_trajectory()])
        unit.write_many("pairs", pairs)
        unit.write("quarantine", Quarantined(id="bad/1", stage="convert", error=QUARANTINE_REASON,
                                             raw='{"id": "1", "steps": [1, 2, "x"]}', location="input.jsonl:17"))
        unit.write("quarantine", Quarantined(id="bad/2", stage="parse", error="JSONDecodeError: truncated line",
                                             raw='{"id": "2", "ste', location="input.jsonl:18"))
        unit.write("filtered", Filtered(record=tool_trajectory(9), decision=FilterDecision(
            filter="no_loops", reason="the same call repeats 3 times", score=0.0)))
    screenshot_png(path / SCREENSHOT)
    return ds
