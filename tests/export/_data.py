"""Hand-made trajectories and pairs for the exporter tests, and a helper that stores them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from converters.adp import from_adp
from schemas.models import (
    ApiAction,
    CodeAction,
    ImageObservation,
    ImageRef,
    JsonObservation,
    MessageAction,
    Pair,
    TextObservation,
    Tool,
    Trajectory,
    WebObservation,
)
from schemas.store import Dataset

WEATHER = Tool(name="get_weather", description="Weather for a city",
               parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def tool_traj(tid: str = "t-tool", source: str = "hand", **kw: Any) -> Trajectory:
    """system, user, api(thought+reasoning) -> json obs, two parallel calls -> two obs, final message."""
    return Trajectory(id=tid, source=source, tools=[WEATHER], success=True, steps=[
        TextObservation(content="You are a weather bot.", source="environment", name="system"),
        TextObservation(content="Weather in Paris and Rome?", source="user"),
        ApiAction(function="get_weather", arguments={"city": "Paris"}, thought="Check Paris first.",
                  reasoning="The user wants two cities.", tool_call_id="c1"),
        JsonObservation(content={"temp": 21, "sky": "clear"}, tool_call_id="c1"),
        ApiAction(function="get_weather", arguments={"city": "Rome"}),
        ApiAction(function="lookup", arguments={"q": "Rome"}),
        TextObservation(content="lookup: Rome is in Italy", source="environment"),
        TextObservation(content="Rome: 25C", source="user"),
        MessageAction(content="Paris 21C clear, Rome 25C."),
    ], **kw)


def masked_traj(tid: str = "t-masked", source: str = "hand") -> Trajectory:
    """Agent-R style: a masked bad prefix, then a trainable revision and continuation."""
    return Trajectory(id=tid, source=source, success=True, steps=[
        TextObservation(content="Find the file size of data.csv", source="user"),
        CodeAction(language="bash", content="cat MASKEDALPHA.csv", train=False, label="bad"),
        TextObservation(content="No such file", source="environment"),
        CodeAction(language="bash", content="ls -l data.csv", thought="TRAINEDBETA revise: list it", train=True),
        TextObservation(content="-rw 1024 data.csv", source="environment"),
        MessageAction(content="TRAINEDGAMMA it is 1024 bytes", train=True),
    ])


def interleaved_traj(tid: str = "t-inter", source: str = "hand") -> Trajectory:
    """trainable, masked, trainable: the masked middle step must never land in a completion."""
    return Trajectory(id=tid, source=source, steps=[
        TextObservation(content="Count the lines of notes.txt", source="user"),
        CodeAction(language="bash", content="wc -l TRAINEDONE.txt"),
        TextObservation(content="No such file", source="environment"),
        CodeAction(language="bash", content="wc -l MASKEDTWO.txt", train=False),
        TextObservation(content="No such file again", source="environment"),
        CodeAction(language="bash", content="wc -l notes.txt TRAINEDTHREE"),
        TextObservation(content="12 notes.txt", source="environment"),
        MessageAction(content="TRAINEDFOUR twelve lines"),
    ])


def labeled_traj(tid: str = "t-labeled", source: str = "hand") -> Trajectory:
    return Trajectory(id=tid, source=source, success=False, steps=[
        TextObservation(content="Open the settings page", source="user"),
        WebObservation(url="http://x/home", axtree="[1] link 'Settings'\n" + "x" * 200,
                       screenshot=ImageRef(path="shots/0.png")),
        ApiAction(function="click", arguments={"bid": "1"}, label="good"),
        WebObservation(url="http://x/settings", html="<html>settings</html>"),
        ApiAction(function="click", arguments={"bid": "9"}, label="bad"),
        ImageObservation(image=ImageRef(path="shots/2.png")),
        MessageAction(content="Done.", label="unknown"),
    ])


def masked_observation_traj(tid: str = "t-maskobs", source: str = "hand") -> Trajectory:
    """A loss-masked tool result between two trainable calls: it must never carry loss."""
    return Trajectory(id=tid, source=source, tools=[WEATHER], success=True, steps=[
        TextObservation(content="Is it warmer in Oslo or Lima?", source="user"),
        ApiAction(function="get_weather", arguments={"city": "Oslo", "units": {"temp": "C"}}, thought="TRAINEDOSLO"),
        TextObservation(content="MASKEDOBS garbled tool output", source="environment", train=False),
        ApiAction(function="get_weather", arguments={"city": "Lima"}, thought="TRAINEDLIMA"),
        JsonObservation(content={"temp": 19}),
        MessageAction(content="TRAINEDANSWER Lima is warmer."),
        TextObservation(content="###STOP###", source="user"),
    ])


def failed_traj(tid: str = "t-failed", source: str = "hand") -> Trajectory:
    return Trajectory(id=tid, source=source, success=False, steps=[
        TextObservation(content="Book a table", source="user"),
        MessageAction(content="FAILEDMARKER I cannot."),
    ])


def no_assistant_traj(tid: str = "t-empty", source: str = "hand") -> Trajectory:
    return Trajectory(id=tid, source=source, steps=[TextObservation(content="hello?", source="user")])


def branch_pair(pid: str = "p1", source: str = "hand") -> tuple[Pair, Trajectory, Trajectory]:
    """Two trajectories sharing their first 3 steps (user, api, obs)."""
    shared = [
        TextObservation(content=f"What is 2+2? Use the calculator. ({pid})", source="user"),
        ApiAction(function="calc", arguments={"expr": "2+2"}, tool_call_id="k1"),
        TextObservation(content="4", source="environment", tool_call_id="k1"),
    ]
    chosen = Trajectory(id=f"{pid}-good", source=source, success=True,
                        steps=[*shared, MessageAction(content="The answer is 4.")])
    rejected = Trajectory(id=f"{pid}-bad", source=source, success=False,
                          steps=[*shared, ApiAction(function="calc", arguments={"expr": "2*2"}),
                                 TextObservation(content="4", source="environment"),
                                 MessageAction(content="Maybe 5.")])
    pair = Pair(id=pid, chosen_id=chosen.id, rejected_id=rejected.id, prefix_len=3, source=source)
    return pair, chosen, rejected


def adp_trajectories(adp_dir: Path) -> list[Trajectory]:
    """Every ADP sample, one per id (upstream repeats some whole records)."""
    out: dict[str, Trajectory] = {}
    for file in sorted(adp_dir.glob("*/sample_std.json")):
        records = json.loads(file.read_text())
        for record in records if isinstance(records, list) else [records]:
            traj = from_adp(record, source=file.parent.name)
            out.setdefault(traj.id, traj)
    return list(out.values())


def store(path: Path, trajectories: Iterable[Trajectory] = (), pairs: Iterable[Pair] = (),
          unit: str = "u0", max_rows: int = 100_000) -> Path:
    ds = Dataset.create(path)
    with ds.unit(unit, max_rows=max_rows) as w:
        for t in trajectories:
            w.write("trajectories", t)
        for p in pairs:
            w.write("pairs", p)
    return path
