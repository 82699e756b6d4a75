"""Converters whose raw format was learned from ADP's repository (no shipped raw sample here).

Fixtures are trimmed copies of ADP's own sample_raw.json records (provenance in each fixture's
`_provenance`). During development the converters were also checked against ADP's full
sample_std.json for these datasets (all records matched); here we assert concrete values.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _compare import FIXTURES, MODULES, load, module, units


def convert_all(name: str) -> list:
    fixture = load(FIXTURES / f"{MODULES[name]}.json")
    assert fixture["_provenance"].startswith("Trimmed copies of records from ADP")
    return [module(name).convert(u) for u in units(name, fixture["records"])]


def test_agenttuning_mind2web() -> None:
    t, u = convert_all("agenttuning_mind2web")
    assert t.provenance.source_id == "mind2web_96" and t.source == "agenttuning_mind2web"
    assert [s.kind for s in t.steps] == ["text", "message"]
    assert t.steps[0].source == "user" and t.steps[0].content.startswith("'''\n<html>")
    assert t.steps[1].content == "<finish> B.\nAction: CLICK </finish>"
    assert t.steps[1].thought.startswith("I need to get a price quote for a new car")
    assert u.steps[1].content == "<finish> C.\nAction: SET\nValue: $50,000 </finish>"
    assert t.details["option_in_prompt"] is True


def test_eto() -> None:
    t, u = convert_all("eto")
    assert t.provenance.source_id == "webshop_0" and t.reward == 1.0 and t.success is True
    assert u.reward == 0.75 and u.success is False
    assert [s.kind for s in t.steps] == ["text", "message"] * 4
    assert t.steps[1].content == "OK" and t.steps[1].thought == ""
    assert t.steps[-1].content.startswith("<finish> Thought: The product details confirm")
    assert t.provenance.source_dataset == "agent-eto/eto-sft-trajectory"


def test_omniact() -> None:
    t, _ = convert_all("omniact")
    assert t.provenance.source_id == "train_0"
    assert [s.kind for s in t.steps] == ["image", "text", "code"]
    image = t.steps[0].image
    assert image.path == "data/data/web/asics/screen1.png" and len(image.annotations) == 3
    first = image.annotations[0]
    assert first.text == "search_button" and first.element_type == "button"
    assert first.bounding_box.width > 0 and first.bounding_box.height > 0
    assert t.steps[1].content == "Review the products added to the cart"
    assert (t.steps[2].language, t.steps[2].content, t.steps[2].thought) == ("python", "pyautogui.click(1288.5,116.0)", "Output Script")


def test_screenagent() -> None:
    t, u = convert_all("screenagent")
    assert [t.provenance.source_id, u.provenance.source_id] == ["5053328985ad454ea4a097eb27dca593_0", "5053328985ad454ea4a097eb27dca593_1"]
    assert [(s.kind, getattr(s, "source", None)) for s in t.steps] == [("text", "user"), ("message", None)]
    assert t.steps[0].content == "Enlarge the displayed webpage"
    assert t.steps[1].content.startswith('```json\n[\n    {"action_type": "PlanAction", "element": "Open the browser settings menu"}')


def test_nnetnav_live() -> None:
    (t,) = convert_all("nnetnav-live")
    assert t.provenance.source_id == "openweb_6442" and t.details["completed"] is True
    assert [s.kind for s in t.steps] == ["text", "web", "api", "web", "message"]
    assert t.steps[0].content.startswith("You are given the following objective: Evaluate the limit")
    assert t.steps[1].url == "https://www.wolframalpha.com/"
    assert t.steps[2].function == "type"
    assert t.steps[2].arguments == {"bid": '"89"', "text": '"limit ((sin x - x)/x^3) as x->0"', "press_enter_after": "0"}
    assert t.steps[4].content == "<finish> -1/6 </finish>"
    assert {"click", "type", "goto"} <= {tool.name for tool in t.tools}


def test_androidcontrol() -> None:
    t, u = convert_all("androidcontrol")
    assert t.provenance.source_id == "0"
    assert [s.kind for s in t.steps] == ["message", "image", "api", "image", "api", "image"]
    assert t.steps[0].content == "Open the Zoho Meet app , view the scheduled meetings ."
    assert t.steps[1].image.path == "0/screenshot_0.png" and t.steps[1].image.source == "user"
    ann = t.steps[1].image.annotations
    assert ann[0].text == "8:37" and ann[0].element_type == "android.widget.TextView"
    assert ann[0].bounding_box.model_dump() == {"x": 145, "y": 1, "width": 84, "height": 135}
    assert ann[1].text == "Battery charging, 100 percent."
    assert (t.steps[2].function, t.steps[2].arguments, t.steps[2].thought) == ("open_app", {"app_name": "Zoho Meeting"}, "Open the Zoho Meet app")
    assert t.steps[4].function == "wait"
    assert [(s.function, s.arguments) for s in u.steps if s.kind == "api"] == [("back", {}), ("click", {"x": 110, "y": 506})]


def test_swe_play_trajectories() -> None:
    t, _ = convert_all("swe-play-trajectories")
    assert t.provenance.source_id == "swe-play-0"
    assert t.provenance.source_dataset == "StephenZhu/SWE-Play-trajectories"
    assert [(s.kind, getattr(s, "source", None)) for s in t.steps] == [
        ("text", "user"), ("api", None), ("text", "environment"), ("api", None), ("text", "environment"), ("api", None)]
    assert t.steps[1].function == "str_replace_editor" and t.steps[1].arguments == {"command": "view", "path": "/workspace"}
    assert t.steps[1].thought.startswith("I'll start by exploring the project directory")
    assert t.steps[5].arguments == {"command": "view", "path": "/workspace/src/cpu_simulator/cpu.py"}
    assert t.details["category"] == "general" and t.details["source"] == "cpu-architecture-simulator"
    assert "system" in t.details
